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


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


# Public: `prefixscope up` offers the same options and passes them on to the engine it starts.
add_engine_options = _add_engine_options


def engine_config_from(args: argparse.Namespace):
    from local_engine.config import EngineConfig

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
    )


def _serve(args: argparse.Namespace) -> int:
    import os
    import sys

    from local_engine.config import ServerConfig
    from local_engine.engine import Engine
    from local_engine.model_loader import load_model, resolve_device
    from local_engine.access import ENV_API_KEY, check_bind
    from local_engine.attention_backends import resolve_attention_backend
    from local_engine.server import create_app
    from local_engine.shutdown import serve

    api_key = args.api_key or os.environ.get(ENV_API_KEY) or None
    refusal = check_bind(args.host, api_key, args.insecure)
    if refusal:
        print(f"prefixscope engine: {refusal}", file=sys.stderr)
        return 2
    config = engine_config_from(args)
    device = resolve_device(config.device)
    try:
        resolve_attention_backend(config.attention_backend, device)
    except ValueError as error:
        print(f"prefixscope engine: {error}", file=sys.stderr)
        return 2
    loaded = load_model(config.model, device)
    engine = Engine(config, loaded)
    admin_token = args.admin_token or os.environ.get("PREFIXSCOPE_ENGINE_ADMIN_TOKEN")
    server_config = ServerConfig(host=args.host, port=args.port, admin_token=admin_token, api_key=api_key)
    print(
        f"prefixscope engine: {loaded.model_id} on {loaded.device} ({loaded.dtype}), KV pool "
        f"{engine.pool.num_slots} tokens ({engine.pool.num_bytes / 2**30:.2f} GiB), page size {config.page_size}, "
        f"{'prefix cache ' + config.eviction if config.prefix_cache else 'no prefix cache'}, "
        f"{engine.runner.attention_backend} attention; "
        f"listening on http://{args.host}:{args.port}",
        flush=True,
    )
    engine.start()
    try:
        serve(create_app(engine, server_config), engine, args.host, args.port, args.log_level, config.shutdown_grace_s)
    finally:
        engine.stop()
    return 0


def _bench(args: argparse.Namespace) -> int:
    from local_engine.bench import run_engine_benchmark

    return run_engine_benchmark(args)


def register(commands, bench_commands) -> None:
    serve = commands.add_parser("engine", help="serve a model with the radix prefix cache (OpenAI-compatible API)")
    _add_engine_options(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8001)
    serve.add_argument(
        "--admin-token", default=None, help="required by the cache views (/v1/cache, /v1/cache/tree, /v1/cache/flush)"
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
        "--shutdown-grace-s", type=float, default=10.0,
        help="on SIGTERM, stop admitting and give in-flight requests this long to finish before cancelling them",
    )
    serve.set_defaults(handler=_serve)

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
    bench.add_argument("--requests-per-run", type=int, default=4, help="requests per run (at least C)")
    bench.set_defaults(handler=_bench, kv_cache_tokens=None)
