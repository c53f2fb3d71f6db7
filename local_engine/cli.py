"""`prefixscope engine` and `prefixscope bench engine`. Imports torch only when a command runs."""

from __future__ import annotations

import argparse

from local_engine.config import EngineConfig, ServerConfig
from local_engine.options import add_options, at_least, config_from


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """The engine options `prefixscope engine`, `prefixscope up` and the engine benchmarks share (EngineConfig's
    passed-on options)."""
    add_options(parser, EngineConfig, passed_on=True)


def check_engine_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Cross-option checks argparse cannot express; reports through `parser.error` (exit status 2)."""
    if getattr(args, "disk_cache_gib", None) is not None and not getattr(args, "disk_cache_dir", None):
        parser.error("--disk-cache-gib needs --disk-cache-dir")
    lower = bool(args.host_cache_tokens or args.host_cache_gib or args.disk_cache_dir)
    if lower and args.no_prefix_cache:
        parser.error("the host and disk cache tiers need the prefix cache: drop --no-prefix-cache")


def _int_list(text: str) -> list[int]:
    """argparse type: comma-separated whole numbers >= 1 ('' is none)."""
    return [at_least(1)(part.strip()) for part in text.split(",") if part.strip()]


def engine_config_from(args: argparse.Namespace):
    """EngineConfig from parsed arguments (an option `args` lacks keeps its default); raises ValueError."""
    return config_from(EngineConfig, args)


def configure_logging(level: str) -> None:
    """The engine's log on stderr at `level` (the access log is INFO: local_engine.api.access_log), with the noisy
    libraries quietened (prefixscope.logs)."""
    import logging

    from prefixscope.logs import quiet_library_loggers

    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_library_loggers(debug=level == "debug")


def _serve(args: argparse.Namespace) -> int:
    import os
    import sys
    import threading

    from local_engine.engine.compute_threads import serialize_caller
    from local_engine.engine.engine import Engine
    from local_engine.model.loader import load_model, resolve_device
    from local_engine.api.access import ENV_API_KEY, check_bind
    from local_engine.model.attention_backends import resolve_attention_backend
    from local_engine.api.server import create_app
    from local_engine.engine.shutdown import serve

    if getattr(args, "engine_parser", None) is not None:
        check_engine_options(args.engine_parser, args)
    configure_logging(args.log_level)
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
    serialize_caller()  # torch's threads are the engine worker's (local_engine.engine.compute_threads)
    loaded = load_model(config.model, device, config.dtype)
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
    server_config = config_from(ServerConfig, args, admin_token=admin_token, api_key=api_key,
                                trace_export=trace_export)
    from local_engine.model import cpu_kernels

    decode_kernels = ", decode on the CPU kernels" if cpu_kernels.attends(engine.pool.k) else ""
    if loaded.device.type == "cpu" and not cpu_kernels.available():
        decode_kernels = f", torch's kernels only (CPU kernels: {cpu_kernels.unavailable_reason()})"
    print(
        f"prefixscope engine: {loaded.model_id} on {loaded.device} ({loaded.dtype}), KV pool "
        f"{engine.allocator.num_slots} tokens ({engine.pool.num_bytes / 2**30:.2f} GiB), page size {config.page_size}, "
        f"{'prefix cache ' + config.eviction if config.prefix_cache else 'no prefix cache'}{engine.tiers_summary()}, "
        f"{engine.runner.attention_backend} attention{decode_kernels}, "
        f"batch invariant: {'yes' if engine.runner.batch_invariant else 'no'}; "
        f"listening on http://{args.host}:{args.port}",
        flush=True,
    )

    def started() -> None:
        if engine.kv_events is not None and engine.kv_events.bound_endpoint:
            print(f"prefixscope engine: KV events on {engine.kv_events.bound_endpoint}"
                  f" (replay {engine.kv_events.bound_replay_endpoint or 'off'})", flush=True)

    # The server listens at once; /health says 503 `starting` until the warm-up has run and the engine has started.
    ready = threading.Event()
    app = create_app(engine, server_config, ready=ready, access_log=getattr(args, "access_log", True))
    try:
        error = serve(app, engine, args.host, args.port, args.log_level, config.shutdown_grace_s, ready=ready,
                      warm=not getattr(args, "no_warm_up", False), on_started=started)
    finally:
        engine.stop()
    if isinstance(error, OSError):  # a KV events address that is taken or cannot be bound
        print(f"prefixscope engine: cannot publish KV events: {error}", file=sys.stderr)
        return 2
    if error is not None:
        print(f"prefixscope engine: could not start: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


def trace_export_from(otlp_endpoint: str | None, env):
    """`--otlp-endpoint` wins; else the standard OTEL_* variables; None: no spans (or the variables turn them off).
    Raises ValueError on malformed OTEL_EXPORTER_OTLP_HEADERS or OTEL_EXPORTER_OTLP_TIMEOUT."""
    from prefixscope.tracing import ENV_TRACES_ENDPOINT, export_from_env, traces_url, tracing_disabled
    from local_engine.api.tracing import SERVICE_NAME

    if tracing_disabled(env):
        return None
    if otlp_endpoint:
        # The OTEL_* variables still give the headers and timeout (`prefixscope up` passes the gateway config's so).
        return export_from_env({**env, ENV_TRACES_ENDPOINT: traces_url(otlp_endpoint)}, SERVICE_NAME)
    return export_from_env(env, SERVICE_NAME)


def _bench(args: argparse.Namespace) -> int:
    from local_engine.bench.engine import run_engine_benchmark

    return run_engine_benchmark(args)


def register(commands, bench_commands) -> None:
    serve = commands.add_parser("engine", help="serve a model with the radix prefix cache (OpenAI-compatible API)")
    add_engine_options(serve)
    add_options(serve, ServerConfig)
    serve.add_argument(
        "--insecure", action="store_true", help="allow listening on a non-loopback address without an API key"
    )
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                       help="the engine's log level; at info it writes one access-log line per request")
    serve.add_argument("--no-access-log", dest="access_log", action="store_false",
                       help="no access-log line per request (as uvicorn's --no-access-log)")
    serve.add_argument("--no-warm-up", action="store_true",
                       help="say ready without the warm-up (local_engine.engine.warm_up): the first requests then "
                            "pay its one-time costs")
    serve.add_argument(
        "--otlp-endpoint", default=None, metavar="URL",
        help="export request spans over OTLP/HTTP to this collector (base URL or full /v1/traces URL; default: the "
             "OTEL_EXPORTER_OTLP_* variables, else no spans)",
    )
    add_options(serve, EngineConfig, passed_on=False)
    serve.set_defaults(handler=_serve, engine_parser=serve)

    bench = bench_commands.add_parser("engine", help="TTFT on cache hits vs misses, against the no-cache baseline")
    add_engine_options(bench)
    bench.add_argument("--num-prefixes", type=at_least(1), default=4, help="distinct long system prompts")
    bench.add_argument("--prefix-tokens", type=at_least(64), default=2048, help="tokens of each system prompt")
    bench.add_argument("--turns-per-prefix", type=at_least(2), default=4,
                       help="requests per system prompt (the first misses, the others hit)")
    bench.add_argument("--max-tokens", type=at_least(1), default=16, help="max_tokens of the hit/miss TTFT requests")
    bench.add_argument("--seed", type=int, default=0, help="seed of the prompts' random text")
    bench.add_argument(
        "--concurrency", type=_int_list, default=[1, 8, 32],
        help="requests in flight in the concurrent shared-prefix workload, comma-separated ('' skips it)",
    )
    bench.add_argument("--bench-max-tokens", type=_int_list, default=[32, 128], help="max_tokens of each run")
    bench.add_argument(
        "--requests-per-run", type=at_least(1), default=24,
        help="requests per run (at least C): several waves of C measure steady throughput, not one synchronized start",
    )
    bench.add_argument(
        "--api-rounds", type=at_least(0), default=3,
        help="rounds of the API sections (constrained decoding at C=1 and 8, n=4 vs 4 requests); 0 skips them",
    )
    bench.add_argument(
        "--agreement-prompts", type=at_least(0), default=8,
        help="prompts of the bf16-against-fp32 greedy agreement check (32 tokens each); 0 skips it",
    )
    bench.add_argument(
        "--invariance-prompts", type=at_least(0), default=4,
        help="prompts of the batch-invariance check (each answered cold, cached, partly cached, in small steps and "
        "batched, with and without --no-batch-invariant), also measuring its cost at C=1 and C=8; 0 skips both",
    )
    bench.set_defaults(handler=_bench, kv_cache_tokens=None)
