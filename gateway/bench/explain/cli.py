"""`prefixscope bench explain` (cheap to import: the benchmark's modules load when it runs)."""

from __future__ import annotations

import argparse
from typing import Any

from gateway.bench.explain.settings import EngineSettings

DEFAULTS = EngineSettings()


def register(commands: Any, bench_commands: Any) -> None:
    parser = bench_commands.add_parser(
        "explain",
        help="injected cache breaks in agent conversations: the recorded reason, location and ledger vs the truth",
        description="Start two engines (16-token pages, a small pool, a short TTL) and a gateway, play agent "
        "conversations with one injected change of each kind (a clean next turn, a timestamp, reordered or edited "
        "tools, an edited system prompt, a compacted history, a previous answer re-sent differently, a tool result "
        "re-serialized, a model alias, another model, eviction, expiry, a short shared opening, a replica holding "
        "less, another tenant), read the recorded rows and print per kind the recorded cause, segment and offset "
        "against the truth, and the share of rows whose token ledger adds up, with a verdict (exit 1 on FAIL).",
    )
    parser.add_argument("--model", default=DEFAULTS.model, help="engine model: smollm2 or a local model directory")
    parser.add_argument("--page-size", type=int, default=DEFAULTS.page_size, help="the engines' tokens per page")
    parser.add_argument("--pool-tokens", type=int, default=DEFAULTS.pool_tokens, help="each engine's KV pool, tokens")
    parser.add_argument("--ttl", type=float, default=DEFAULTS.ttl_s, help="the engines' idle TTL, seconds")
    parser.add_argument("--kinds", default=None, help="comma-separated kinds to run (none given: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the think times")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs, database)")
    parser.set_defaults(handler=run_explain_bench)


def run_explain_bench(args: argparse.Namespace) -> int:
    from gateway.bench.explain.kinds import KINDS
    from gateway.bench.explain.run import ExplainBenchConfig, run

    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip()) if args.kinds else tuple(KINDS)
    engines = EngineSettings(model=args.model, page_size=args.page_size, pool_tokens=args.pool_tokens,
                             ttl_s=args.ttl)
    return run(ExplainBenchConfig(engines=engines, kinds=kinds, seed=args.seed, keep=args.keep))
