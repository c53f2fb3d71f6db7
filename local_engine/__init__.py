"""The prefixscope inference engine: a radix-tree KV prefix cache over a KV pool, serving an OpenAI-compatible API."""
