"""Progress reporting: plain lines off a terminal (with an estimate of the time left), a bar on one, nothing on
standard output, so `--json` output stays a JSON document."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefixscope.progress import ENV_PROGRESS, format_duration, progress

ROOT = Path(__file__).resolve().parents[1]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _default_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PROGRESS, raising=False)
    monkeypatch.delenv("PREFIXSCOPE_PROGRESS_INTERVAL_S", raising=False)


def test_off_a_terminal_a_line_every_interval_with_the_time_left() -> None:
    clock, out = FakeClock(), io.StringIO()
    with progress("demo-data", total=400, unit="requests", stream=out, interval_s=10, clock=clock) as bar:
        for _ in range(4):
            clock.now += 6
            bar.advance(100)
    assert out.getvalue().splitlines() == [
        "demo-data: 200/400 requests (50%), 12s elapsed, about 12s left",
        "demo-data: 400/400 requests (100%), 24s elapsed",
        "demo-data: 400/400 requests (100%), done in 24s",
    ]


def test_unknown_totals_count_without_an_estimate_and_short_work_prints_nothing() -> None:
    clock, out = FakeClock(), io.StringIO()
    with progress("export-trace", unit="requests", stream=out, interval_s=10, clock=clock) as bar:
        for item in bar.iterate(range(3)):
            clock.now += 5 * item
    assert out.getvalue().splitlines() == [
        "export-trace: 3 requests, 15s elapsed",
        "export-trace: 3 requests, done in 15s",
    ]
    clock, out = FakeClock(), io.StringIO()
    with progress("loading the model", stream=out, interval_s=10, clock=clock):
        clock.now += 83
    assert out.getvalue() == "loading the model, done in 1m23s\n"
    quiet = io.StringIO()
    with progress("fast", total=2, stream=quiet, interval_s=10, clock=FakeClock()) as bar:
        bar.advance(2)
    assert quiet.getvalue() == ""


def test_progress_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PROGRESS, "0")
    clock, out = FakeClock(), Terminal()
    with progress("work", total=2, stream=out, interval_s=0, clock=clock) as bar:
        clock.now += 100
        bar.advance(2)
    assert out.getvalue() == ""


def test_on_a_terminal_a_bar() -> None:
    out = Terminal()
    with progress("bench engine: prefix cache", total=3, unit="requests", stream=out) as bar:
        for _ in range(3):
            bar.advance()
    text = out.getvalue()
    assert "bench engine: prefix cache" in text and "3/3" in text and "requests" in text and "━" in text


def test_output_written_during_a_bar_stays_on_standard_output(capsys: pytest.CaptureFixture[str]) -> None:
    """`export-trace --out - > trace.jsonl` on a terminal: the bar is on stderr, the trace must still reach the file."""
    out = Terminal()
    with progress("export-trace", unit="requests", stream=out) as bar:
        for line in bar.iterate(['{"hash_ids": [1]}', '{"hash_ids": [2]}']):
            sys.stdout.write(line + "\n")
    assert capsys.readouterr().out == '{"hash_ids": [1]}\n{"hash_ids": [2]}\n'
    assert "hash_ids" not in out.getvalue()


def test_durations_read_naturally() -> None:
    assert [format_duration(s) for s in (0, 59.4, 61, 3599, 3725)] == ["0s", "59s", "1m01s", "59m59s", "1h02m"]


def test_json_output_has_no_progress_and_progress_goes_to_stderr() -> None:
    env = {**os.environ, "PREFIXSCOPE_PROGRESS_INTERVAL_S": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "prefixscope", "bench", "simulate", "--blocks", "20000"],
        cwd=ROOT, capture_output=True, text=True, env=env, check=True, timeout=300,
    )
    figures = json.loads(result.stdout)  # the whole of stdout is the JSON document
    assert set(figures["policies"]) == {"lru", "fifo", "optimal"}
    lines = result.stderr.splitlines()
    replayed = [line for line in lines if line.startswith("bench simulate: ") and "blocks replayed" in line]
    assert replayed[-1].startswith(
        f"bench simulate: {3 * figures['blocks']:,}/{3 * figures['blocks']:,} blocks replayed")
    assert replayed[-1].endswith("(100%)") or ", done in " in replayed[-1]
    sweep = [line for line in lines if line.startswith("bench simulate: lru sweep")]
    assert sweep and (sweep[-1].endswith("(100%)") or ", done in " in sweep[-1])


def test_demo_data_reports_progress_in_lines(tmp_path: Path) -> None:
    env = {**os.environ, "PREFIXSCOPE_PROGRESS_INTERVAL_S": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "prefixscope", "demo-data", "--rows", "500", "--days", "1",
         "--database-url", f"sqlite:///{tmp_path / 'demo.db'}"],
        cwd=ROOT, capture_output=True, text=True, env=env, check=True, timeout=300,
    )
    assert result.stdout.startswith("wrote 500 demo requests")
    assert result.stderr.splitlines()[0].startswith("demo-data: 500/500 requests (100%), ")
    assert result.stderr.splitlines()[-1].startswith("demo-data: 500/500 requests (100%), done in ")
