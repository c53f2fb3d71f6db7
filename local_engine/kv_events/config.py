"""Where and how the engine publishes its KV events (`prefixscope engine --kv-events-endpoint ...`)."""

from __future__ import annotations

from dataclasses import dataclass

from local_engine.cache.hash_chain import MAX_BLOCK_SIZE

DEFAULT_EVENT_BLOCK_SIZE = 16  # vLLM's default block size


@dataclass(frozen=True)
class KvEventsConfig:
    """`endpoint`: where the PUB socket binds (`tcp://HOST:PORT`; None: no socket, the HTTP view only);
    `replay_endpoint`: where the ROUTER socket binds; `topic`: the first frame of every message."""

    endpoint: str | None = None
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_batches: int = 10_000
    max_queue_changes: int = 100_000
    hwm: int = 100_000
    block_size: int = DEFAULT_EVENT_BLOCK_SIZE  # tokens per announced block

    def __post_init__(self) -> None:
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"kv events {name} must be a ZeroMQ address such as tcp://127.0.0.1:5557")
        if self.replay_endpoint is not None and self.endpoint is None:
            raise ValueError("a kv events replay endpoint needs a kv events endpoint")
        if not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"the kv events block size must be between 1 and {MAX_BLOCK_SIZE}")
        if self.buffer_batches < 1 or self.max_queue_changes < 1:
            raise ValueError("kv events buffers must be positive")
