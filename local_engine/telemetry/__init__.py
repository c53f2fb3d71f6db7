"""The engine's figures under the names other serving engines' boards read (vLLM's); its spans are `api.tracing`."""
