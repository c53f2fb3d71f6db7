"""Benchmarks that cannot mislead: one JSON document on stdout, verdict lines on stderr, exit status 1 on any FAIL,
`--help` with every default and the run time; throughput never counts error answers; every dashboard page measured."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from prefixscope.bench_report import RUN_TIMES, emit
from prefixscope.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
BENCH_MODULES = (
    "local_engine/bench/engine.py", "local_engine/bench/tiers.py", "gateway/bench/runner.py", "gateway/bench/routing.py",
    "gateway/bench/explain/run.py",
    "gateway/advisor/bench.py", "dashboard/bench.py", "db/simulation/commands.py", "db/commands.py",
)


def _bench_parsers() -> dict[str, object]:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    bench = commands.choices["bench"]
    return next(a for a in bench._actions if a.dest == "bench_command").choices


def test_emit_prints_one_document_and_fails_on_any_failed_target() -> None:
    out, err = io.StringIO(), io.StringIO()
    report = {"figure": 1.5, "verdicts": {"fast": {"value": 1.5, "target": "<= 1", "pass": False},
                                          "small": {"value": 3, "target": "<= 4", "pass": True}},
              "pass": True}  # an overall flag that disagrees with a target still fails
    assert emit(report, out, err) == 1
    assert json.loads(out.getvalue()) == report
    assert err.getvalue().splitlines() == ["FAIL fast: 1.5 (target <= 1)", "PASS small: 3 (target <= 4)", "FAIL"]
    out, err = io.StringIO(), io.StringIO()
    assert emit({"verdict": {"pass": True, "targets": {"x": {"measured": 1, "target": 2, "pass": True}}}}, out, err) == 0
    assert err.getvalue().splitlines()[-1] == "PASS"
    with pytest.raises(ValueError):
        emit({"figure": 1}, io.StringIO(), io.StringIO())  # a benchmark without a verdict is refused


def test_every_bench_ends_through_emit() -> None:
    for module in BENCH_MODULES:
        source = (ROOT / module).read_text()
        assert "bench_report import emit" in source, module
        if not module.startswith("db/"):  # db's modules also hold the non-bench commands' --json output
            assert not re.search(r"print\(json\.dumps\(", source), f"{module} prints JSON itself"


def test_every_bench_help_shows_defaults_and_run_time(capsys: pytest.CaptureFixture[str]) -> None:
    parsers = _bench_parsers()
    assert set(parsers) <= set(RUN_TIMES), set(parsers) - set(RUN_TIMES)
    for name in parsers:
        with pytest.raises(SystemExit):
            main(["bench", name, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "(default:" in text, name
        assert " ".join(RUN_TIMES[name].split()) in text, name


def test_error_answers_are_not_throughput() -> None:
    from gateway.bench.loadgen import Tally, summarize

    tally = Tally(sent=4)
    for status in (200, 200, 429, 503):
        tally.add(status, 0.001)
    figures = summarize(tally, 1.0)
    assert (figures["completed"], figures["error_answers"], figures["rate_per_s"]) == (2, 2, 2.0)


def test_the_kv_memory_check_measures_where_the_pool_lives() -> None:
    import torch

    from local_engine.bench.concurrent import kv_memory_probe

    name, probe = kv_memory_probe(torch.device("cpu"))
    with probe:
        pass
    assert name == "host_rss" and probe.peak_bytes >= probe.start_bytes > 0
    if torch.cuda.is_available():
        name, probe = kv_memory_probe(torch.device("cuda", 0))
        with probe:
            held = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
            del held
        assert name == "cuda_allocated" and probe.peak_bytes - probe.start_bytes >= 64 << 20


def test_bench_dashboard_measures_every_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    status = main(["bench", "dashboard", "--rows", "400", "--repeats", "1", "--database-url", url])
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # the whole of stdout is one document
    views = {path.stem for path in (ROOT / "dashboard" / "views").glob("*.py")}
    assert set(report["pages"]) == views and len(views) == 10
    for page, figures in report["pages"].items():
        assert figures["query_ms_median"] > 0, page  # measured, not a constant
        assert figures["queries_ms_median"], page
    assert status == (0 if report["pass"] else 1)
    assert captured.err.strip().splitlines()[-1] == ("PASS" if report["pass"] else "FAIL")
