"""The engine's HTTP edge: OpenAI-compatible routes, request parsing and validation, response bodies, access,
OpenAPI, metrics and the cache events API."""
