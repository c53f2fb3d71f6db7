"""`prefixscope simulate --retention`: stored requests replayed with a retention class per prefix.

Each choice is a class for every prefix (`none`, `5m`, `1h`, `persistent`) or `advised`: each prefix under the class
the retention advice finds best for it (`db.queries.retention`, priced as a local engine at the engine's measured
prefill speed, the cache this replay models). The replay is `db.simulation.retention.replay_retention`: unlimited
capacity, each block idle for at most its class's TTL. Prints the token hit rate of each choice (JSON with `--json`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from db.retention.costs import CLASS_TTL_S, NO_CACHE
from db.simulation.retention import replay_retention

CHOICES = (NO_CACHE, *CLASS_TTL_S, "advised")


def parse_choices(text: str) -> list[str]:
    """`none,5m,advised` -> the choices; raises ValueError naming an unknown one."""
    choices = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in choices if item not in CHOICES]
    if unknown or not choices:
        raise ValueError(f"--retention: unknown choice {unknown[0] if unknown else text!r}; choose from "
                         f"{', '.join(CHOICES)}")
    return choices


def simulate_retention(args: argparse.Namespace, since: Any, until: Any, conn: Any) -> int:
    from db.engine_context import latest_engine_context
    from db.queries.retention import retention_advice
    from db.retention.costs import CostModel
    from db.simulation.retention_trace import prefix_key, retention_trace

    choices = parse_choices(args.retention)
    trace = retention_trace(conn, since, until, args.tenant)
    advised: dict[str, str] = {}
    if "advised" in choices:
        context = latest_engine_context(conn)
        speed = None if context is None else context.prefill_tokens_per_s
        model = CostModel.for_kind("local_engine", {"prefill_ms_per_token": 1000 / speed} if speed else {})
        for tenant in retention_advice(conn, since, lambda _: model, until, args.tenant, top=10**9):
            for prefix in tenant.prefixes:
                advised[prefix_key(tenant.tenant, prefix.prefix_hash)] = prefix.best.retention
    results = []
    for choice in choices:
        replay = replay_retention(trace, (lambda key: advised.get(key, NO_CACHE)) if choice == "advised" else
                                  (lambda _, c=choice: c))
        results.append({"retention": choice, "requests": len(trace), "prompt_tokens": replay.prompt_tokens,
                        "hit_tokens": replay.hit_tokens, "token_hit_rate": replay.token_hit_rate})
    if args.json:
        print(json.dumps({"retention": results}, indent=2))
        return 0
    print(f"{len(trace):,} requests with a chain and a prefix hash")
    print("| retention | token hit rate | hit tokens | prompt tokens |")
    print("|---|---|---|---|")
    for row in results:
        rate = "-" if row["token_hit_rate"] is None else f"{100 * row['token_hit_rate']:.1f}%"
        print(f"| {row['retention']} | {rate} | {row['hit_tokens']:,} | {row['prompt_tokens']:,} |")
    return 0
