"""`prefixscope engine` and `prefixscope bench engine`. Imports torch only when a command runs."""

from __future__ import annotations

import argparse


def _add_engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="'smollm2' or a local transformers model directory")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--kv-cache-tokens", type=int, default=None, help="KV pool capacity in tokens")
    size.add_argument("--kv-cache-gib", type=float, default=None, help="KV pool capacity in GiB")
    parser.add_argument("--page-size", type=int, default=1, help="tokens per page (matches are page-aligned)")
    parser.add_argument("--eviction", default="lru", choices=["lru", "fifo", "lfu"])
    parser.add_argument("--ttl", type=float, default=None, metavar="SECONDS", help="drop prefixes unused this long")
    parser.add_argument("--no-prefix-cache", action="store_true", help="serve without reuse (A/B baseline)")
    parser.add_argument(
        "--max-num-seqs", "--max-active-requests", dest="max_num_seqs", type=int, default=32,
        help="running requests batched into each step",
    )
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=512,
        help="tokens per step (decode tokens plus prefill chunks); longer prompts are prefilled in chunks",
    )
    parser.add_argument(
        "--attention-backend", default="auto", choices=["auto", "torch", "flashinfer"],
        help="paged attention over the KV pool: FlashInfer's kernels (CUDA, flashinfer-python installed) or the "
        "torch path; auto picks FlashInfer when it can run",
    )
    _add_tier_options(parser)


def _add_tier_options(parser: argparse.ArgumentParser) -> None:
    host = parser.add_mutually_exclusive_group()
    host.add_argument(
        "--host-cache-tokens", type=_non_negative_int, default=None, metavar="N",
        help="L2 host-memory KV tier capacity in tokens (0 or absent: off)",
    )
    host.add_argument(
        "--host-cache-gib", type=_non_negative_float, default=None, metavar="G",
        help="L2 host-memory KV tier capacity in GiB (0 or absent: off)",
    )
    parser.add_argument(
        "--disk-cache-dir", default=None, metavar="PATH",
        help="L3 disk KV tier directory (kept across restarts; one engine per directory)",
    )
    parser.add_argument(
        "--disk-cache-gib", type=_positive_float, default=None, metavar="G",
        help="L3 disk tier capacity in GiB (default 10 when --disk-cache-dir is given)",
    )
    parser.add_argument(
        "--cache-write-policy", default="write_back", choices=["write_back", "write_through"],
        help="write_back: KV goes down a tier when evicted; write_through: copies go down at insert time",
    )
    events = parser.add_argument_group("KV events (vLLM's and SGLang's ZeroMQ format; docs/fleets.md)")
    events.add_argument(
        "--kv-events-endpoint", default=None, metavar="tcp://HOST:PORT",
        help="publish the cache's KV events on a ZeroMQ PUB socket bound here (they carry token ids: keep it private)",
    )
    events.add_argument(
        "--kv-events-replay-endpoint", default=None, metavar="tcp://HOST:PORT",
        help="answer replay requests (from a sequence number) on a ZeroMQ ROUTER socket bound here",
    )
    events.add_argument("--kv-events-topic", default="", help="the topic frame of every KV-event message")
    events.add_argument(
        "--kv-events-block-size", type=int, default=16, metavar="TOKENS", help="tokens per announced block",
    )


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative (0 turns the tier off)")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a size in GiB (0 turns the tier off)")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("the size must be positive")
    return value


def check_engine_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Cross-option checks argparse cannot express; reports through `parser.error` (exit status 2)."""
    if getattr(args, "disk_cache_gib", None) is not None and not getattr(args, "disk_cache_dir", None):
        parser.error("--disk-cache-gib needs --disk-cache-dir")
    lower = bool(args.host_cache_tokens or args.host_cache_gib or args.disk_cache_dir)
    if lower and args.no_prefix_cache:
        parser.error("the host and disk cache tiers need the prefix cache: drop --no-prefix-cache")


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


# Public: `prefixscope up` offers the same options and passes them on to the engine it starts.
add_engine_options = _add_engine_options


def engine_config_from(args: argparse.Namespace):
    from local_engine.config import EngineConfig
    from local_engine.kv_events.config import KvEventsConfig

    return EngineConfig(
        model=args.model,
        device=args.device,
        kv_cache_tokens=args.kv_cache_tokens,
        kv_cache_gib=args.kv_cache_gib,
        page_size=args.page_size,
        eviction=args.eviction,
        ttl_s=args.ttl,
        prefix_cache=not args.no_prefix_cache,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        shutdown_grace_s=getattr(args, "shutdown_grace_s", 10.0),
        attention_backend=args.attention_backend,
        host_cache_tokens=args.host_cache_tokens,
        host_cache_gib=args.host_cache_gib,
        disk_cache_dir=args.disk_cache_dir,
        disk_cache_gib=args.disk_cache_gib,
        cache_write_policy=args.cache_write_policy,
        kv_events=KvEventsConfig(
            endpoint=args.kv_events_endpoint, replay_endpoint=args.kv_events_replay_endpoint,
            topic=args.kv_events_topic, block_size=args.kv_events_block_size,
        ),
    )


def _serve(args: argparse.Namespace) -> int:
    import os
    import sys

    from local_engine.config import ServerConfig
    from local_engine.engine.engine import Engine
    from local_engine.model.loader import load_model, resolve_device
    from local_engine.api.access import ENV_API_KEY, check_bind
    from local_engine.model.attention_backends import resolve_attention_backend
    from local_engine.api.server import create_app
    from local_engine.engine.shutdown import serve

    if getattr(args, "engine_parser", None) is not None:
        check_engine_options(args.engine_parser, args)
    api_key = args.api_key or os.environ.get(ENV_API_KEY) or None
    refusal = check_bind(args.host, api_key, args.insecure)
    if refusal:
        print(f"prefixscope engine: {refusal}", file=sys.stderr)
        return 2
    from local_engine.cache.tiers.disk_index import DiskCacheLocked
    from local_engine.engine.kv_tiers import TierUnavailable, reserve_disk_directory

    try:
        config = engine_config_from(args)
        if config.disk_cache_dir:
            reserve_disk_directory(config.disk_cache_dir)  # before the model loads: a bad or taken one fails at once
    except (DiskCacheLocked, TierUnavailable) as error:
        print(f"prefixscope engine: {error}", file=sys.stderr)
        return 2
    except ValueError as error:
        print(f"prefixscope engine: error: {error}", file=sys.stderr)
        return 2
    device = resolve_device(config.device)
    try:
        resolve_attention_backend(config.attention_backend, device)
    except ValueError as error:
        print(f"prefixscope engine: {error}", file=sys.stderr)
        return 2
    loaded = load_model(config.model, device)
    try:
        engine = Engine(config, loaded)
    except (DiskCacheLocked, TierUnavailable) as error:
        print(f"prefixscope engine: {error}", file=sys.stderr)
        return 2
    admin_token = args.admin_token or os.environ.get("PREFIXSCOPE_ENGINE_ADMIN_TOKEN")
    try:
        trace_export = trace_export_from(args.otlp_endpoint, os.environ)
    except ValueError as error:
        print(f"prefixscope engine: {error}", file=sys.stderr)
        return 2
    server_config = ServerConfig(host=args.host, port=args.port, admin_token=admin_token, api_key=api_key,
                                 trace_export=trace_export)
    print(
        f"prefixscope engine: {loaded.model_id} on {loaded.device} ({loaded.dtype}), KV pool "
        f"{engine.pool.num_slots} tokens ({engine.pool.num_bytes / 2**30:.2f} GiB), page size {config.page_size}, "
        f"{'prefix cache ' + config.eviction if config.prefix_cache else 'no prefix cache'}{engine.tiers_summary()}, "
        f"{engine.runner.attention_backend} attention; "
        f"listening on http://{args.host}:{args.port}",
        flush=True,
    )
    try:
        engine.start()
    except OSError as error:  # a KV events address that is taken or cannot be bound
        print(f"prefixscope engine: cannot publish KV events: {error}", file=sys.stderr)
        engine.stop()
        return 2
    if engine.kv_events is not None and engine.kv_events.bound_endpoint:
        print(f"prefixscope engine: KV events on {engine.kv_events.bound_endpoint}"
              f" (replay {engine.kv_events.bound_replay_endpoint or 'off'})", flush=True)
    try:
        serve(create_app(engine, server_config), engine, args.host, args.port, args.log_level, config.shutdown_grace_s)
    finally:
        engine.stop()
    return 0


def trace_export_from(otlp_endpoint: str | None, env):
    """`--otlp-endpoint` wins; else the standard OTEL_* variables; None: no spans (or the variables turn them off).
    Raises ValueError on malformed OTEL_EXPORTER_OTLP_HEADERS."""
    from prefixscope.tracing import TraceExport, export_from_env, traces_url, tracing_disabled
    from local_engine.api.tracing import SERVICE_NAME

    if tracing_disabled(env):
        return None
    from_env = export_from_env(env, SERVICE_NAME)
    if otlp_endpoint:
        return TraceExport(traces_url=traces_url(otlp_endpoint),
                           service_name=from_env.service_name if from_env else SERVICE_NAME,
                           headers=from_env.headers if from_env else {})
    return from_env


def _bench(args: argparse.Namespace) -> int:
    from local_engine.bench.engine import run_engine_benchmark

    return run_engine_benchmark(args)


def register(commands, bench_commands) -> None:
    serve = commands.add_parser("engine", help="serve a model with the radix prefix cache (OpenAI-compatible API)")
    _add_engine_options(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8001)
    serve.add_argument(
        "--admin-token", default=None,
        help="required by the cache views that show or drop every namespace (/v1/cache/tree, /v1/cache/flush)"
    )
    serve.add_argument(
        "--api-key",
        default=None,
        help="required on every endpoint but /health (default: $PREFIXSCOPE_ENGINE_API_KEY)",
    )
    serve.add_argument(
        "--insecure", action="store_true", help="allow listening on a non-loopback address without an API key"
    )
    serve.add_argument("--log-level", default="warning")
    serve.add_argument(
        "--otlp-endpoint", default=None, metavar="URL",
        help="export request spans over OTLP/HTTP to this collector (base URL or full /v1/traces URL; default: the "
             "OTEL_EXPORTER_OTLP_* variables, else no spans)",
    )
    serve.add_argument(
        "--shutdown-grace-s", type=float, default=10.0,
        help="on SIGTERM, stop admitting and give in-flight requests this long to finish before cancelling them",
    )
    serve.set_defaults(handler=_serve, engine_parser=serve)

    bench = bench_commands.add_parser("engine", help="TTFT on cache hits vs misses, against the no-cache baseline")
    _add_engine_options(bench)
    bench.add_argument("--num-prefixes", type=int, default=4, help="distinct long system prompts")
    bench.add_argument("--prefix-tokens", type=int, default=2048)
    bench.add_argument("--turns-per-prefix", type=int, default=4, help="requests per system prompt")
    bench.add_argument("--max-tokens", type=int, default=16)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument(
        "--concurrency", type=_int_list, default=[1, 8, 32],
        help="requests in flight in the concurrent shared-prefix workload, comma-separated ('' skips it)",
    )
    bench.add_argument("--bench-max-tokens", type=_int_list, default=[32, 128], help="max_tokens of each run")
    bench.add_argument(
        "--requests-per-run", type=int, default=24,
        help="requests per run (at least C): several waves of C measure steady throughput, not one synchronized start",
    )
    bench.add_argument(
        "--api-rounds", type=int, default=3,
        help="rounds of the API sections (constrained decoding at C=1 and 8, n=4 vs 4 requests); 0 skips them",
    )
    bench.set_defaults(handler=_bench, kv_cache_tokens=None)
