"""How every `prefixscope bench ...` ends: one JSON document on standard output, verdict lines on standard error, and
an exit status that says whether every target was met.

Standard output carries only the JSON document, so `prefixscope bench gateway > figures.json` and
`... | python -m json.tool` work; the PASS/FAIL lines a person reads go to standard error. A benchmark states its
verdict in the document as `"pass": bool` with per-target results (`verdicts` or `verdict.targets`, each
`{"pass": bool, ...}`); `emit` returns 1 when any of them failed.

`RUN_TIMES` says how long each benchmark takes with its defaults; `prefixscope bench NAME --help` shows it with every
option's default. Imports nothing from the programs (every package may use it).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any, TextIO

RUN_TIMES: Mapping[str, str] = {
    "engine": "With the defaults it takes about 8-10 minutes on a 2-core CPU (SmolLM2-135M) and 1-2 on a GPU.",
    "tiers": "With the defaults it takes about 2-5 minutes on a CPU (three engine restarts) and about 1 on a GPU.",
    "gateway": "With the defaults it takes about 40 seconds (two 10-second runs plus start-up and the drain).",
    "dashboard": "The first run writes --rows demo requests (about 1-2 minutes per million rows); later runs reuse "
    "the database and take under a minute (--render adds about 10 seconds per page).",
    "advise": "With the defaults it takes about 1-3 minutes on a CPU (one engine, four rule sets).",
    "routing": "With the defaults it takes about 10-20 minutes on a CPU (3 engine replicas, three routings: events, "
    "approximate index, round robin).",
    "explain": "With the defaults it takes about 3-6 minutes on an idle 2-core CPU (two engines, 22 kinds, about 55 "
    "requests, an idle wait past the TTL), several times that on a loaded one.",
    "simulate": "With the defaults it takes about 10-30 seconds.",
    "db-queries": "The first run writes --rows demo requests (about 20 seconds per 100,000 rows); the queries take "
    "seconds.",
}


def targets_of(report: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The per-target results of a report: `verdicts`, or `verdict.targets`, or `{}`."""
    if isinstance(report.get("verdicts"), Mapping):
        return dict(report["verdicts"])
    verdict = report.get("verdict")
    if isinstance(verdict, Mapping) and isinstance(verdict.get("targets"), Mapping):
        return dict(verdict["targets"])
    return {}


def passed(report: Mapping[str, Any]) -> bool:
    """Whether the report's overall verdict and every per-target verdict passed."""
    overall = report.get("pass")
    verdict = report.get("verdict")
    if overall is None and isinstance(verdict, Mapping):
        overall = verdict.get("pass")
    targets = targets_of(report)
    if overall is None and not targets:
        raise ValueError("a benchmark report must state its verdict: `pass` or `verdict.pass`")
    return bool(overall if overall is not None else True) and all(bool(t.get("pass")) for t in targets.values())


def emit(report: Mapping[str, Any], out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print `report` as one JSON document on `out` (stdout), a PASS/FAIL line per target and overall on `err`
    (stderr); returns the exit status: 0 when every target passed, else 1."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    ok = passed(report)
    out.write(json.dumps(report, indent=2, default=str) + "\n")
    out.flush()
    for name, result in targets_of(report).items():
        figure = result.get("measured", result.get("value"))
        print(f"{'PASS' if result.get('pass') else 'FAIL'} {name}: {figure} (target {result.get('target')})", file=err)
    print("PASS" if ok else "FAIL", file=err)
    return 0 if ok else 1


def describe_benchmarks(bench_commands: Any) -> None:
    """Give every `prefixscope bench NAME` parser a help that shows each option's default and the run time."""
    import argparse

    helps = {action.dest: action.help for action in bench_commands._choices_actions}
    for name, parser in bench_commands.choices.items():
        parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
        text = parser.description or helps.get(name) or ""
        run_time = RUN_TIMES.get(name)
        if run_time and run_time not in text:
            parser.description = f"{text.rstrip('.')}. {run_time}" if text else run_time
