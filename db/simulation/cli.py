"""The simulator's subcommands of `prefixscope`: `simulate`, `export-trace` and `bench simulate`.

Cheap to import: only argparse here. Each handler imports `db.simulation.commands` (and, for the database, SQLAlchemy)
when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

Handler = Callable[[argparse.Namespace], int]

DEFAULT_CAPACITIES = "100k,1M,10M"
DEFAULT_POLICIES = "lru,fifo,optimal"
# The bench's sweep: 12 capacities from a cache that evicts all the time to one that holds the synthetic trace.
BENCH_SWEEP = "10k,20k,50k,100k,200k,300k,500k,700k,1M,1.5M,2M,5M"


def _lazy(name: str) -> Handler:
    """A handler that imports `db.simulation.commands` on first use and calls the function called `name`."""

    def handler(args: argparse.Namespace) -> int:
        from db.simulation import commands

        result: int = getattr(commands, name)(args)
        return result

    handler.__name__ = name
    return handler


def _with_selection(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Which stored request chains to read: database, time range, tenant."""
    parser.add_argument(
        "--database-url",
        default=None,
        help="database URL (default: $PREFIXSCOPE_DATABASE_URL, else prefixscope.db in the state directory)",
    )
    parser.add_argument("--since", default=None, help="start: a duration before now (7d, 12h) or ISO time (default 7d)")
    parser.add_argument("--until", default=None, help="end (exclusive): a duration before now or ISO time")
    parser.add_argument("--tenant", default=None, help="only this tenant's requests")
    return parser


def add_simulate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of `prefixscope simulate`."""
    _with_selection(parser)
    parser.add_argument("--trace", default=None, help="replay this trace file (JSON lines) instead of the database")
    parser.add_argument(
        "--block-size", type=int, default=None, help="block size of trace lines that state none (Mooncake's: 512)"
    )
    parser.add_argument(
        "--capacity",
        default=DEFAULT_CAPACITIES,
        help=f"cache sizes in tokens (the device tier, L1), e.g. 100k,1M,inf (default {DEFAULT_CAPACITIES})",
    )
    parser.add_argument(
        "--host-capacity",
        default=None,
        help="host tier (L2) sizes in tokens below the device, e.g. 0,1M,10M: a block evicted from the device is "
        "demoted to the host, a host hit moves it back; hits are reported per tier (default 0: no host tier). "
        "LRU only, so the policy defaults to lru when this is given",
    )
    parser.add_argument(
        "--policy",
        default=None,
        help=f"eviction policies: lru, fifo, optimal (default {DEFAULT_POLICIES}). lru computes every capacity from "
        "one pass over the trace (stack distances); fifo and optimal have no such shortcut and replay each capacity",
    )
    parser.add_argument("--ttl", default="none", help="idle times after which a block expires, e.g. none,5m,1h")
    parser.add_argument(
        "--retention",
        default=None,
        help="instead: replay stored requests with a retention class per prefix, for each choice of none, 5m, 1h, "
        "persistent (every prefix) or advised (each prefix's best class from the retention advice), e.g. "
        "none,5m,1h,advised; unlimited capacity",
    )
    parser.add_argument(
        "--page",
        type=int,
        default=None,
        help="page size in tokens, a multiple of the recorded block size (default: it)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=_lazy("simulate_command"))
    return parser


def register(commands: Any, bench_commands: Any) -> None:
    """Add the simulator's commands to the `prefixscope` parser (see `prefixscope.cli`)."""
    add_simulate_arguments(
        commands.add_parser("simulate", help="what-if replay of recorded prompts through a prefix cache")
    )
    export = _with_selection(commands.add_parser("export-trace", help="write recorded block hash chains as a trace"))
    export.add_argument("--out", required=True, help="trace file to write (JSON lines; '-' for standard output)")
    export.set_defaults(handler=_lazy("export_trace_command"))
    bench = bench_commands.add_parser(
        "simulate",
        help="time the cache simulator on a synthetic trace: each policy at one capacity, and an LRU sweep from one "
        "pass (stack distances) against one replay per capacity",
    )
    bench.add_argument("--blocks", type=int, default=1_000_000, help="blocks in the synthetic trace (default 1000000)")
    bench.add_argument("--trace", default=None, help="time this trace file (JSON lines) instead of a synthetic trace")
    bench.add_argument(
        "--block-size", type=int, default=None, help="block size of trace lines that state none (Mooncake's: 512)"
    )
    bench.add_argument("--capacity", default="100k", help="cache size in tokens (default 100k: small enough to evict)")
    bench.add_argument(
        "--sweep", default=BENCH_SWEEP, help=f"the LRU sweep's cache sizes in tokens (default the 12 of {BENCH_SWEEP})"
    )
    bench.add_argument("--ttl", default="none", help="block TTL (default none)")
    bench.add_argument("--seed", type=int, default=0, help="random seed of the synthetic trace")
    bench.set_defaults(handler=_lazy("bench_simulate"))
