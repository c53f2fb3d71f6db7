"""`prefixscope <command>`: each program registers its own subcommands.

Every program's `cli` module must stay cheap to import (no torch, no web framework at module level), so that
`prefixscope keys create` does not pay for loading the engine. Handlers import what they need when they run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from prefixscope.bench_report import describe_benchmarks

# Modules with a `register(commands, bench_commands)` function. Listed by name so that a program whose optional
# dependencies are missing does not break the others' commands.
_PROGRAM_CLIS = (
    "local_engine.cli",
    "local_engine.bench.tiers",
    "gateway.cli",
    "gateway.bench.explain.cli",
    "gateway.advisor.cli",
    "gateway.demo.cli",
    "db.cli",
    "db.simulation.cli",
    "dashboard.cli",
    "prefixscope.stack",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prefixscope", description="Prompt-cache engine, gateway and dashboard.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = commands.add_parser("bench", help="benchmarks that print figures")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    for module_name in _PROGRAM_CLIS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(commands, bench_commands)
    describe_benchmarks(bench_commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.handler(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`prefixscope stats --json | head`): that is its choice, not an error. Point stdout
        # at /dev/null so that the interpreter's final flush does not raise again (Python's documented recipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        # Ctrl-C: a terminal sends it to every program `prefixscope up` started too, often while one is still
        # importing or loading its model. Stopping is what the user asked for; no traceback, the usual status.
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
