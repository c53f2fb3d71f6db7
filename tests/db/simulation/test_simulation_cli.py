"""`prefixscope simulate`, `export-trace` and `bench simulate`, run in-process through `prefixscope.cli.main`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from db.chains import RequestChain
from db.engine import create_sync_engine_for
from db.records import RequestRecord
from db.simulation import Trace, TraceRequest, export_trace, read_trace, simulate
from db.store import store_records
from db.timeutil import utc_now
from prefixscope import cli


@pytest.fixture(autouse=True)
def _simulation_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """The program list with the simulator's commands in it (once, whether or not it lists them already)."""
    monkeypatch.setattr(cli, "_PROGRAM_CLIS", tuple(dict.fromkeys((*cli._PROGRAM_CLIS, "db.simulation.cli"))))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


REQUESTS = [
    TraceRequest(0.0, 40, (1, 2), 16),
    TraceRequest(1.0, 50, (1, 2, 3), 16),
    TraceRequest(2.0, 20, (9,), 16),
    TraceRequest(100.0, 50, (1, 2, 3), 16),
]


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    export_trace(REQUESTS, path)
    return path


def test_simulate_trace_file_table(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "simulate", "--trace", str(trace_file), "--capacity", "32,inf", "--ttl", "none,1m")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "4 requests, 9 blocks of 16 tokens, 160 prompt tokens"
    assert lines[1].split() == [
        "CAPACITY",
        "POLICY",
        "TTL",
        "TOKEN",
        "HIT",
        "BLOCK",
        "HIT",
        "REQ",
        "HIT",
        "EVICTED",
        "EXPIRED",
    ]
    rows = {tuple(line.split()[:3]): line.split()[3:] for line in lines[2:]}
    assert len(rows) == 2 * 3 * 2
    # Unlimited, no TTL: blocks 1, 2 hit at t=1 and 1, 2, 3 at t=100: 5 blocks, 80 of 160 tokens.
    assert rows[("inf", "lru", "none")][:3] == ["50.0%", "55.6%", "50.0%"]
    # With a one-minute TTL everything has expired by t=100.
    assert rows[("inf", "optimal", "1m")][:3] == ["20.0%", "22.2%", "25.0%"]
    assert rows[("inf", "optimal", "1m")][4] == "4"


def test_simulate_trace_file_json_matches_the_library(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys,
        "simulate",
        "--trace",
        str(trace_file),
        "--capacity",
        "2k",
        "--policy",
        "optimal",
        "--ttl",
        "90s",
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert data["trace"] == {
        "requests": 4,
        "blocks": 9,
        "block_size": 16,
        "prompt_tokens": 160,
        "approximate_chains": 0,
    }
    expected = simulate(Trace.from_requests(REQUESTS), 2000, "optimal", 90.0).to_dict()
    assert data["results"] == [expected]


def test_simulate_with_larger_pages(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "simulate", "--trace", str(trace_file), "--page", "32", "--capacity", "inf", "--json")
    assert code == 0
    assert json.loads(out)["trace"]["blocks"] == 1 + 1 + 0 + 1
    code, _, err = _run(capsys, "simulate", "--trace", str(trace_file), "--page", "24")
    assert code == 2 and "not a multiple of the recorded block size 16" in err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--policy", "lru,mru"], "unknown eviction policy 'mru'"),
        (["--capacity", "10q"], "not a cache size"),
        (["--ttl", "soon"], "not a TTL"),
        (["--tenant", "acme"], "--tenant: only for stored requests"),
    ],
)
def test_simulate_refuses_bad_options(
    trace_file: Path, options: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, "simulate", "--trace", str(trace_file), *options)
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err


def test_simulate_missing_or_bad_trace_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "simulate", "--trace", str(tmp_path / "none.jsonl"))
    assert code == 2 and "cannot open trace file" in err
    (tmp_path / "bad.jsonl").write_text("{}\n")
    code, _, err = _run(capsys, "simulate", "--trace", str(tmp_path / "bad.jsonl"))
    assert code == 2 and "trace line 1" in err


def test_bench_simulate_prints_figures(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "bench", "simulate", "--blocks", "3000", "--capacity", "10k")
    assert code == 0
    figures = json.loads(out)
    assert figures["blocks"] >= 3000 and figures["capacity_tokens"] == 10_000
    assert set(figures["policies"]) == {"lru", "fifo", "optimal"}
    rates = {policy: figure["token_hit_rate"] for policy, figure in figures["policies"].items()}
    assert rates["optimal"] >= max(rates["lru"], rates["fifo"])
    sweep_figures = figures["lru_sweep"]
    assert sweep_figures["points"] == 12 == len(sweep_figures["capacities_tokens"])
    assert sweep_figures["agree"] is True
    assert sweep_figures["one_pass"]["blocks_per_s"] > 0 and sweep_figures["replay"]["blocks_per_s"] > 0
    assert sweep_figures["speedup"] > 0
    # Larger caches never hit less under LRU (the inclusion property the one pass rests on).
    assert sweep_figures["token_hit_rates"] == sorted(sweep_figures["token_hit_rates"])


def test_bench_simulate_reads_a_trace_file(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "bench", "simulate", "--trace", str(trace_file), "--sweep", "16,32,inf")
    assert code == 0, err
    figures = json.loads(out)
    assert (figures["blocks"], figures["requests"]) == (9, 4)
    assert figures["lru_sweep"]["capacities_tokens"] == [16, 32, None]
    assert figures["lru_sweep"]["agree"] is True
    assert figures["lru_sweep"]["token_hit_rates"][-1] == 0.5


def test_simulate_host_capacity_table_splits_hits_by_tier(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A device of one block (16 tokens) and a host of one or two. At t=1, [1, 2, 3] finds 1 on the device (the first
    # block of the last request is the most recent) and 2 on the host when the host holds one block or more.
    argv = ["simulate", "--trace", str(trace_file), "--capacity", "16", "--host-capacity", "0,16,32"]
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split() == [
        "CAPACITY",
        "HOST",
        "POLICY",
        "TTL",
        "TOKEN",
        "HIT",
        "DEVICE",
        "HIT",
        "HOST",
        "HIT",
        "BLOCK",
        "HIT",
        "REQ",
        "HIT",
        "EVICTED",
        "EXPIRED",
    ]
    rows = {tuple(line.split()[:4]): line.split()[4:] for line in lines[2:]}
    assert set(rows) == {("16", host, "lru", "none") for host in ("0", "16", "32")}  # lru only by default
    trace = Trace.from_requests(REQUESTS)
    for host, tokens in (("0", 0), ("16", 16), ("32", 32)):
        expected = simulate(trace, 16, "lru", None, tokens)
        token_hit, device_hit, host_hit = rows[("16", host, "lru", "none")][:3]
        assert token_hit == f"{100 * expected.token_hit_rate:.1f}%"
        assert device_hit == f"{100 * expected.device_token_hit_rate:.1f}%"
        assert host_hit == f"{100 * expected.host_token_hit_rate:.1f}%"
    assert rows[("16", "0", "lru", "none")][2] == "0.0%"
    assert rows[("16", "16", "lru", "none")][2] != "0.0%"


def test_simulate_host_capacity_json_matches_the_library(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(trace_file), "--capacity", "16,inf", "--host-capacity", "2k", "--json"]
    code, out, _ = _run(capsys, *argv, "--ttl", "none,1m")
    assert code == 0
    trace = Trace.from_requests(REQUESTS)
    expected = [
        simulate(trace, capacity, "lru", ttl, 2000).to_dict() for capacity in (16, None) for ttl in (None, 60.0)
    ]
    results = json.loads(out)["results"]
    assert results == expected
    assert results[0]["host_hit_tokens"] > 0 and results[0]["host_capacity_blocks"] == 125
    assert results[0]["device_hit_tokens"] + results[0]["host_hit_tokens"] == results[0]["hit_tokens"]


def test_simulate_host_capacity_refuses_other_policies(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(trace_file), "--host-capacity", "1M", "--policy", "lru,fifo"]
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert "--host-capacity: a host tier is modelled for lru only (an LRU hierarchy with demotion), not for fifo" in err
    # Without a host tier every policy is still replayed.
    code, out, err = _run(capsys, "simulate", "--trace", str(trace_file), "--host-capacity", "0", "--policy", "fifo")
    assert code == 0, err
    code, _, err = _run(capsys, "simulate", "--trace", str(trace_file), "--host-capacity", "lots")
    assert code == 2 and "not a cache size" in err


def _store_chains(url: str, start: datetime) -> None:
    chains = [
        ("acme", RequestChain(16, 40, (1, 2))),
        ("acme", RequestChain(16, 50, (1, 2, 3))),
        ("initech", RequestChain(16, 20, (9,), approximate=True)),
        ("acme", RequestChain(16, 50, (1, 2, 3))),
    ]
    records = [
        RequestRecord(
            request_id=f"r{index}",
            created_at=start + timedelta(seconds=index),
            tenant=tenant,
            key_id=None,
            endpoint="chat.completions",
            model="m1",
            upstream="local",
            stream=False,
            status_code=200,
            error_type=None,
            prompt_tokens=chain.input_length,
            cached_tokens=0,
            completion_tokens=1,
            ttft_ms=10.0,
            latency_ms=20.0,
            chain=chain,
        )
        for index, (tenant, chain) in enumerate(chains)
    ]
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as conn:
            store_records(conn, records)
    finally:
        engine.dispose()


def test_database_export_and_simulate(db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    start = (utc_now() - timedelta(hours=1)).replace(microsecond=0)
    _store_chains(db_url, start)
    out_file = tmp_path / "exported.jsonl"
    code, out, err = _run(capsys, "export-trace", "--database-url", db_url, "--since", "1d", "--out", str(out_file))
    assert code == 0, err
    assert out.strip() == f"wrote 4 requests to {out_file}"
    exported = read_trace(out_file)
    assert exported.timestamps_s == (0.0, 1.0, 2.0, 3.0) and exported.num_approximate == 1

    argv = ["--capacity", "1k,inf", "--ttl", "none,2s", "--json"]
    code, out, _ = _run(capsys, "simulate", "--database-url", db_url, "--since", "1d", *argv)
    assert code == 0
    from_database = json.loads(out)
    code, out, _ = _run(capsys, "simulate", "--trace", str(out_file), *argv)
    assert json.loads(out) == from_database
    assert from_database["trace"]["approximate_chains"] == 1

    code, out, _ = _run(capsys, "simulate", "--database-url", db_url, "--tenant", "acme", "--capacity", "inf", "--json")
    (result,) = json.loads(out)["results"][:1]
    assert (result["num_requests"], result["hit_blocks"]) == (3, 2 + 3)

    code, out, _ = _run(capsys, "export-trace", "--database-url", db_url, "--tenant", "initech", "--out", "-")
    assert code == 0 and json.loads(out) == {
        "timestamp": 0,
        "input_length": 20,
        "hash_ids": [9],
        "block_size": 16,
        "approximate": True,
    }

    until = (start + timedelta(seconds=1)).astimezone(UTC).isoformat()
    code, out, _ = _run(capsys, "simulate", "--database-url", db_url, "--until", until, "--json")
    assert json.loads(out)["trace"]["requests"] == 1
    code, out, _ = _run(capsys, "simulate", "--database-url", db_url, "--since", "1m")
    assert (code, out.strip()) == (0, "no request chains to replay")


def test_simulator_and_its_cli_module_are_cheap_to_import() -> None:
    import subprocess
    import sys

    script = "import sys, db.simulation, db.simulation.cli; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    loaded = {name.split(".")[0] for name in out.split()}
    assert not loaded & {"sqlalchemy", "torch", "numpy", "local_engine", "gateway", "streamlit", "litestar"}
