"""`prefixscope gateway` and `prefixscope bench gateway`.

Cheap to import: litestar, httpx and the database layer are imported inside the handlers. This module is the
only place where the gateway reads the process environment.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from db.records import ROUTING_POLICIES
from db.writer_config import DURABILITY_MODES, WriterConfig

DEFAULT_CONFIG_FILE = Path("prefixscope.toml")
ENV_DATABASE_URL = "PREFIXSCOPE_DATABASE_URL"
# The local engine's API key for the default upstream (`prefixscope up` sets it to the secret it shares with it).
ENV_UPSTREAM_API_KEY = "PREFIXSCOPE_UPSTREAM_API_KEY"


def register(commands: Any, bench_commands: Any) -> None:
    """Add the gateway's subcommands to the `prefixscope` parser."""
    gateway = commands.add_parser(
        "gateway",
        help="run the OpenAI-compatible gateway",
        description="Run the gateway: auth, normalization, tenant-isolated routing, streaming and recording.",
    )
    gateway.add_argument(
        "--config", type=Path, default=None, help="TOML config (default: ./prefixscope.toml if present)"
    )
    gateway.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    gateway.add_argument("--port", type=int, default=None, help="listen port (default 8080)")
    gateway.add_argument(
        "--upstream",
        action="append",
        default=None,
        metavar="URL",
        help="URL of the default upstream engine; repeat it for a replica set (routed by --routing)",
    )
    gateway.add_argument(
        "--routing",
        default=None,
        choices=ROUTING_POLICIES,
        help="routing policy over the default upstream's replicas (default: cache_aware for several)",
    )
    gateway.add_argument(
        "--database-url", default=None, help=f"database URL (default: ${ENV_DATABASE_URL}, the config, or SQLite)"
    )
    gateway.add_argument(
        "--open",
        action="store_true",
        help='serve without API keys: every request is tenant "default" with admin rights (same as auth = "none")',
    )
    gateway.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    gateway.set_defaults(handler=run_gateway)

    bench = bench_commands.add_parser(
        "gateway",
        help="added latency and throughput of the gateway against a stub upstream",
        description="Start a stub upstream and the gateway (recording into a temporary SQLite database), then "
        "measure added latency at a fixed rate, the highest sustained rate, and that no record is lost.",
    )
    bench.add_argument(
        "--rate", type=float, default=200.0, help="pairs per second for the paired latency run (one direct, one proxied)"
    )
    bench.add_argument("--duration", type=float, default=10.0, help="seconds per measured run")
    bench.add_argument("--connections", type=int, default=64, help="client connections for the throughput run")
    bench.add_argument("--stream", action="store_true", help="use streamed requests")
    bench.add_argument(
        "--durability",
        default=WriterConfig.durability,
        choices=DURABILITY_MODES,
        help="the gateway's recording durability mode ([recorder] durability)",
    )
    bench.add_argument(
        "--port-base",
        type=int,
        default=None,
        help="listen on PORT (stub upstream) and PORT+1 (gateway) on 127.0.0.1 instead of free ports the system picks",
    )
    bench.add_argument(
        "--tracing",
        action="store_true",
        help="also measure a gateway exporting a span per request (OTLP/HTTP to the stub): its added p50 against "
        "tracing off",
    )
    bench.set_defaults(handler=run_bench)

    routing = bench_commands.add_parser(
        "routing",
        help="cache-aware routing over KV events vs the approximate index vs round robin, over engine replicas",
        description="Start engine replicas (publishing KV events) with pools of about 0.6x the working set and "
        "replay the same requests routed cache-aware over their KV events, cache-aware over the gateway's approximate "
        "index, and round robin; print hit rate, TTFT, load per replica and the router's decision time with 100k "
        "indexed blocks, with a verdict (exit 1 on FAIL).",
    )
    routing.add_argument("--model", default="smollm2", help="engine model: smollm2 or a local model directory")
    routing.add_argument("--replicas", default="3", help="replica counts to run, comma-separated")
    routing.add_argument("--prompts", type=int, default=4, help="K distinct system prompts")
    routing.add_argument("--prompt-tokens", type=int, default=800, help="approximate tokens per system prompt")
    routing.add_argument("--rounds", type=int, default=12, help="requests per system prompt")
    routing.add_argument("--indexed-blocks", type=int, default=100_000, help="blocks indexed for the decision time")
    routing.set_defaults(handler=run_routing_bench)


def resolve_database_url(explicit: str | None, from_config: str | None) -> str:
    """--database-url, then $PREFIXSCOPE_DATABASE_URL, then the config file, then db's default."""
    from db.config import database_url_from_env

    return database_url_from_env(explicit or os.environ.get(ENV_DATABASE_URL) or from_config)


def run_gateway(args: argparse.Namespace) -> int:
    import logging
    from dataclasses import replace

    from gateway.config import ConfigOverrides, load_config
    from gateway.errors import ConfigError
    from gateway.state import place_state
    from gateway.config.telemetry import with_environment
    from prefixscope.logs import quiet_library_loggers
    from prefixscope.paths import state_dir

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_library_loggers(debug=args.log_level == "debug")
    config_path = args.config
    if config_path is None and DEFAULT_CONFIG_FILE.exists():
        config_path = DEFAULT_CONFIG_FILE
    try:
        config = load_config(
            config_path,
            ConfigOverrides(
                host=args.host,
                port=args.port,
                upstream_url=args.upstream[0] if args.upstream and len(args.upstream) == 1 else None,
                replica_urls=tuple(args.upstream) if args.upstream and len(args.upstream) > 1 else (),
                routing=args.routing,
                open_mode=args.open or None,
                upstream_api_key=os.environ.get(ENV_UPSTREAM_API_KEY) or None,
            ),
        )
        database_url = resolve_database_url(args.database_url, config.database_url)
        config = place_state(config, state_dir())
        config = replace(config, telemetry=with_environment(config.telemetry, os.environ))
    except (ConfigError, ValueError) as exc:
        print(f"prefixscope gateway: {exc}", file=sys.stderr)
        return 2
    if args.log_level in ("debug", "info"):
        _print_paths(config, config_path, database_url)
    from gateway.server import serve

    try:
        serve(config, database_url, log_level=args.log_level)
    except ConfigError as exc:  # found while building the app: the server secret file, say
        print(f"prefixscope gateway: {exc}", file=sys.stderr)
        return 2
    return 0


def _print_paths(config: Any, config_path: Path | None, database_url: str) -> None:
    """Say at start-up which files this gateway uses, so state in an unexpected place is noticed at once."""
    import re

    secret = "set in the config" if config.server_secret else str(config.secret_file.resolve())
    lines = [
        f"config    {config_path.resolve() if config_path else '(none: defaults)'}",
        f"database  {re.sub(r'//[^@/]*@', '//***@', database_url)}",
        f"secret    {secret}",
        f"spill     {config.recorder.spill_path.resolve()}",
    ]
    print("\n".join(f"prefixscope gateway: {line}" for line in lines), file=sys.stderr, flush=True)


def run_bench(args: argparse.Namespace) -> int:
    from gateway.bench.runner import BenchConfig, run

    return run(
        BenchConfig(
            rate_per_s=args.rate,
            duration_s=args.duration,
            num_connections=args.connections,
            stream=args.stream,
            durability=args.durability,
            port_base=args.port_base,
            tracing=args.tracing,
        )
    )


def run_routing_bench(args: argparse.Namespace) -> int:
    from gateway.bench.routing import RoutingBenchConfig, run

    return run(
        RoutingBenchConfig(
            model=args.model,
            replica_counts=tuple(int(n) for n in args.replicas.split(",")),
            num_prompts=args.prompts,
            prompt_tokens=args.prompt_tokens,
            rounds=args.rounds,
            indexed_blocks=args.indexed_blocks,
        )
    )
