"""The prefixscope gateway: an OpenAI-compatible reverse proxy that authenticates tenants, keeps prompts
cache-friendly (normalization), isolates tenants' prefix caches (server-derived salts), forwards to an upstream
engine over HTTP and records every request without waiting on the database."""
