"""The engine benchmarks report progress on stderr through the shared helper (`prefixscope.progress`), never on
stdout, which carries only the JSON result."""

from __future__ import annotations

import argparse

from local_engine.bench.concurrent import run_concurrent_workload
from prefixscope.progress import ENV_INTERVAL_S, ENV_PROGRESS


def test_the_concurrent_workload_reports_progress_with_the_shared_helper(make_engine, tiny_loaded, capsys,
                                                                         monkeypatch):
    monkeypatch.setenv(ENV_PROGRESS, "lines")
    monkeypatch.setenv(ENV_INTERVAL_S, "0")
    engine = make_engine(kv_cache_tokens=16384)
    args = argparse.Namespace(num_prefixes=2, seed=0, concurrency=[1, 2], bench_max_tokens=[2], requests_per_run=2)
    section = run_concurrent_workload(engine, tiny_loaded.tokenizer, args)
    out, err = capsys.readouterr()
    assert out == ""
    assert [run["concurrency"] for run in section["runs"]] == [1, 2]
    lines = err.splitlines()

    def has(start: str) -> bool:
        return any(line.startswith(start) for line in lines)

    assert has("bench engine: computing the shared system prompts once: 2/2 prompts (100%), done in ")
    for concurrency in (1, 2):
        label = f"bench engine: C={concurrency} max_tokens=2"
        assert has(f"{label}: 1/2 requests (50%), ") and has(f"{label}: 2/2 requests (100%), done in ")
    assert not has("[bench engine]")
