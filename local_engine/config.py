"""Engine and server settings: frozen, built once from the command line, each option declared once (its flag
with it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefixscope.tracing import TraceExport

from local_engine.kv_events.config import KvEventsConfig
from local_engine.options import non_negative_float, non_negative_int, option, option_group, positive_float


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings. Each field declared with `option` is also a flag of `prefixscope engine`, `prefixscope
    up` (which passes it on) and the engine benchmarks: see `local_engine.options`."""

    model: str = option("smollm2", "--model", help="'smollm2' or a local transformers model directory")
    device: str = option("auto", "--device", choices=("auto", "cpu", "cuda"), help="auto: CUDA when there is one")
    dtype: str = option(
        "auto", "--dtype", choices=("auto", "float32", "bfloat16"),
        help="weights and KV dtype; auto: bf16 on CUDA and on CPUs with native bf16 (AVX512-BF16/AMX), else fp32",
    )  # local_engine.model.loader.dtype_for
    # Pool capacity in tokens or in GiB (one of the two; DEFAULT_KV_CACHE_TOKENS applies when neither is set).
    kv_cache_tokens: int | None = option(None, "--kv-cache-tokens", help="KV pool capacity in tokens", group="kv")
    kv_cache_gib: float | None = option(None, "--kv-cache-gib", help="KV pool capacity in GiB", group="kv")
    page_size: int = option(1, "--page-size", help="tokens per page (matches are page-aligned)")
    eviction: str = option("lru", "--eviction", choices=("lru", "fifo", "lfu"),
                           help="which unlocked prefix leaves the device pool first when it fills")
    ttl_s: float | None = option(None, "--ttl", metavar="SECONDS", help="drop prefixes unused this long")
    # False serves with NoPrefixCache, the A/B baseline.
    prefix_cache: bool = option(True, "--no-prefix-cache", help="serve without reuse (A/B baseline)")
    max_num_seqs: int = option(32, "--max-num-seqs", "--max-active-requests",
                               help="running requests batched into each step")
    max_num_batched_tokens: int = option(
        512, "--max-num-batched-tokens",
        help="tokens per step (decode tokens plus prefill chunks); longer prompts are prefilled in chunks",
    )
    shutdown_grace_s: float = option(
        10.0, "--shutdown-grace-s", passed_on=False,
        help="on SIGTERM, stop admitting and give in-flight requests this long to finish before cancelling them",
    )
    max_waiting_requests: int = 256  # beyond this new requests get a 503
    attention_backend: str = option(
        "auto", "--attention-backend", choices=("auto", "torch", "flashinfer"),
        help="paged attention over the KV pool: FlashInfer's kernels (CUDA, flashinfer-python installed) or the "
        "torch path; auto picks FlashInfer when it can run",
    )  # local_engine.model.attention_backends
    enforce_eager: bool = option(
        False, "--enforce-eager",
        help="run every step eagerly: no decode steps replayed from CUDA graphs (used only on CUDA with the "
        "flashinfer attention backend)",
    )  # local_engine.model.graph_step
    cpu_kernels: str = option(
        "auto", "--cpu-kernels", choices=("auto", "off"),
        help="the C kernels for steps on x86-64 CPUs: auto uses them where they are built and run; off runs on "
        "torch's kernels alone, as where they were not built (so does PREFIXSCOPE_CPU_KERNELS=off). One setting per "
        "process: the engine built last sets it",
    )  # local_engine.model.kernel_extension
    batch_invariant: bool = option(
        True, "--no-batch-invariant",
        help="give up batch invariance for speed: by default every step runs kernels whose per-token results do not "
        "depend on the batch, the step's size or the cache state, so a greedy or seeded answer is the same cold, "
        "cached or batched; with this flag a step takes the fastest kernels for its size (oneDNN/MKL GEMMs, SDPA, "
        "shared-prefix decode), whose sums change with the batch, so a cached or batched answer can differ from a "
        "cold one. Where the invariant kernels do not run (CUDA, models outside the fused Llama forward, no CPU "
        "kernels) steps take the fast path either way",
    )  # local_engine.model.invariant_forward
    # Lower KV tiers (off by default): L2 host pool in tokens or GiB (0 = off), L3 disk directory with its capacity
    # (10 GiB when a directory is given), and when copies go down (write_back: on eviction; write_through: at insert).
    host_cache_tokens: int | None = option(
        None, "--host-cache-tokens", parse=non_negative_int, metavar="N", group="host",
        help="L2 host-memory KV tier capacity in tokens (0 or absent: off)",
    )
    host_cache_gib: float | None = option(
        None, "--host-cache-gib", parse=non_negative_float, metavar="G", group="host",
        help="L2 host-memory KV tier capacity in GiB (0 or absent: off)",
    )
    disk_cache_dir: str | None = option(
        None, "--disk-cache-dir", metavar="PATH",
        help="L3 disk KV tier directory (kept across restarts; one engine per directory)",
    )
    disk_cache_gib: float | None = option(
        None, "--disk-cache-gib", parse=positive_float, metavar="G",
        help="L3 disk tier capacity in GiB (default 10 when --disk-cache-dir is given)",
    )
    cache_write_policy: str = option(
        "write_back", "--cache-write-policy", choices=("write_back", "write_through"),
        help="write_back: KV goes down a tier when evicted; write_through: copies go down at insert time",
    )
    # The KV-event stream (local_engine.kv_events); its options are KvEventsConfig's, as `--kv-events-*`.
    kv_events: KvEventsConfig = option_group(
        KvEventsConfig(), "kv_events_", "KV events (vLLM's and SGLang's ZeroMQ format; docs/fleets.md)"
    )

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
    """The HTTP server's settings; the fields declared with `option` are flags of `prefixscope engine`."""

    host: str = option("127.0.0.1", "--host")
    port: int = option(8001, "--port")
    admin_token: str | None = option(
        None, "--admin-token",
        help="required by the cache views that show or drop every namespace (/v1/cache/tree, /v1/cache/flush)",
    )  # local_engine.api.access; flushing needs it
    api_key: str | None = option(
        None, "--api-key", help="required on every endpoint but /health (default: $PREFIXSCOPE_ENGINE_API_KEY)"
    )
    max_body_bytes: int = 8 * 1024 * 1024
    # Where request spans go (`--otlp-endpoint` or the OTEL_* variables); None: no spans.
    trace_export: TraceExport | None = None
