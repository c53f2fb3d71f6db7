"""`prefixscope advise` and `prefixscope bench advise`.

Cheap to import: the database layer and the benchmark are imported inside the handlers.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from db.advice import DEFAULT_MIN_SAMPLES


def register(commands: Any, bench_commands: Any) -> None:
    """Add the advisor's subcommands to the `prefixscope` parser."""
    advise = commands.add_parser(
        "advise",
        help="what each rule a tenant has not enabled would gain, which retention class pays, fleet patterns",
        description="Per tenant and candidate rule: sampled requests, today's token hit rate, the estimated hit rate "
        "with the rule on, tokens and prefill time it would save per day, what it changes, and the prefixscope.toml "
        "lines that enable it. Estimates come from the gateway's rule advisor (advice_sample_rate). Then, per tenant "
        "and its largest prefixes, today's retention class, the class with the best net saving, the saving per day, "
        "the share of writes never read again and the gaps between uses; and the fleet-wide prompt patterns.",
    )
    advise.add_argument("--since", default="1d", help="start: a duration before now (1d, 12h) or ISO time")
    advise.add_argument("--tenant", default=None, help="only this tenant")
    advise.add_argument(
        "--min-samples",
        type=int,
        default=DEFAULT_MIN_SAMPLES,
        help=f"hide estimates resting on fewer sampled requests (default {DEFAULT_MIN_SAMPLES})",
    )
    advise.add_argument("--json", action="store_true", help="print JSON: {rules, retention, patterns}")
    advise.add_argument(
        "--config",
        default=None,
        help="prefixscope.toml with the upstreams' kinds and [advice.cache_prices] (default: ./prefixscope.toml if "
        "present; else every upstream is priced as a local engine)",
    )
    advise.add_argument("--top", type=int, default=5, help="prefixes per tenant and patterns shown (default 5)")
    advise.add_argument(
        "--database-url", default=None, help="database URL (default: $PREFIXSCOPE_DATABASE_URL, else SQLite)"
    )
    advise.set_defaults(handler=run_advise)

    bench = bench_commands.add_parser(
        "advise",
        help="hit rates per rule set on agent traffic, with the advisor's estimate beside each",
        description="Start the engine (SmolLM2) and a gateway, replay agent sessions (volatile values in the system "
        "prompt, shuffled tools, CRLF, growing conversations) under four rule sets, and print each measured token "
        "hit rate beside the advisor's estimate of it.",
    )
    bench.add_argument("--sessions", type=int, default=3, help="sessions per tenant (default 3)")
    bench.add_argument("--turns", type=int, default=6, help="calls per session (default 6)")
    bench.add_argument("--engine", default=None, metavar="URL", help="use this running engine instead of starting one")
    bench.add_argument("--json", action="store_true", help="print only the JSON figures")
    bench.set_defaults(handler=run_bench)


def run_advise(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from db.errors import DatabaseError
    from gateway.advisor.report import advise_command

    try:
        return advise_command(args)
    except (DatabaseError, ValueError) as exc:
        print(f"prefixscope advise: {exc}", file=sys.stderr)
        return 2
    except SQLAlchemyError as exc:
        print(f"prefixscope advise: database: {exc.__class__.__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2


def run_bench(args: argparse.Namespace) -> int:
    from gateway.advisor.bench import BenchConfig, run

    return run(BenchConfig(sessions=args.sessions, turns=args.turns, engine_url=args.engine, json_only=args.json))
