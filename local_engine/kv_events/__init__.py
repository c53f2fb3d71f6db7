"""KV events: the engine's prefix cache published as vLLM's and SGLang's KV-event stream over ZeroMQ.

`wire` declares the messages (the radix cache's `local_engine.cache.block_events` turns the tree's changes into
them) and `publisher` numbers them, sends them on a PUB socket and answers replay requests on a ROUTER socket.
"""
