"""`prefixscope bench explain`: play every kind through the deployment, read the rows back, grade, print."""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gateway.bench.explain.conversation import Context
from gateway.bench.explain.deployment import deployed
from gateway.bench.explain.grading import report, table
from gateway.bench.explain.kinds import KINDS, TENANTS, play
from gateway.bench.explain.settings import EngineSettings

@dataclass(frozen=True)
class ExplainBenchConfig:
    engines: EngineSettings = EngineSettings()
    kinds: tuple[str, ...] = tuple(KINDS)
    think_s: tuple[float, float] = (0.2, 1.0)
    seed: int = 0
    keep: bool = False  # keep the working directory (logs, database)


def run(config: ExplainBenchConfig) -> int:
    from prefixscope.bench_report import emit

    unknown = [kind for kind in config.kinds if kind not in KINDS]
    if unknown:
        print(f"prefixscope bench explain: unknown kinds {unknown}; known: {', '.join(KINDS)}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="prefixscope-bench-explain-"))
    try:
        with deployed(config.engines, list(TENANTS), workdir) as deployment:
            context = Context(deployment, config.engines.ttl_s, config.think_s, random.Random(config.seed))
            cases = play(context, list(config.kinds))
            rows = deployment.rows(context.sent)
        document = report(cases, rows, rows.values())
        document["settings"] = {"page_size": config.engines.page_size, "pool_tokens": config.engines.pool_tokens,
                                "ttl_s": config.engines.ttl_s, "requests": len(context.sent),
                                "rows": len(rows), "workdir": str(workdir) if config.keep else None}
        print(table(document), file=sys.stderr)
        return emit(document)
    finally:
        if not config.keep:
            shutil.rmtree(workdir, ignore_errors=True)
