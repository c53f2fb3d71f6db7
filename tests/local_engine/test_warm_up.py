"""The warm-up before ready (local_engine.engine.warm_up): it runs the serving paths and leaves the engine as a fresh
one's (cache, pool, free list, counters, metrics, KV events), and /health says `starting` until it has finished."""

from __future__ import annotations

import threading

import httpx
import pytest
import torch
import uvicorn

from local_engine.api.metrics import render_metrics
from local_engine.api.server import create_app
from local_engine.config import EngineConfig, ServerConfig
from local_engine.engine import shutdown
from local_engine.engine.engine import Engine
from local_engine.engine.sampling import SamplingParams
from local_engine.engine.shutdown import EngineStarter
from local_engine.engine.types import GenerationRequest
from local_engine.engine.warm_up import INVARIANT_CHUNK_TOKENS, WarmUpStopped, warm_up

from .conftest import run, run_to_end
from .server_fixtures import free_port, wait_until

CONFIG = {"kv_cache_tokens": 2048, "max_num_batched_tokens": 256, "max_num_seqs": 8}


def _state(engine: Engine) -> dict:
    """Everything outside a request that a warm-up could leave behind."""
    stats = engine.cache_stats()
    return {
        "stats": stats,
        # every sample but the `_created` ones, which hold the time each histogram was made
        "metrics": [line for line in render_metrics(engine).decode().splitlines() if "_created" not in line],
        "free_list": engine.allocator.free_slot_ids().tolist(),
        "pool_is_zero": bool((engine.pool.k == 0).all() and (engine.pool.v == 0).all()),
        "num_steps": engine.num_steps,
        "counters": engine.counters.derived(),
        "prefill": (engine.counters.prefill_tokens, engine.counters.prefill_s, engine.counters.finished_requests),
        "kv_events": engine.kv_events.since(0, 100) if engine.kv_events is not None else None,
    }


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_warm_up_leaves_the_engine_as_a_fresh_one(tiny_loaded, batch_invariant):
    fresh = Engine(EngineConfig(**CONFIG, batch_invariant=batch_invariant), tiny_loaded)
    warmed = Engine(EngineConfig(**CONFIG, batch_invariant=batch_invariant), tiny_loaded)
    report = warm_up(warmed)
    # It ran what it says: prefill chunks of the step budget and after a cached prefix, every decode graph size up
    # to --max-num-seqs, and the sampling paths; on the batch-invariant kernels, which build nothing per shape, one
    # short chunk and one decode row.
    if warmed.runner.batch_invariant:
        expected = {f"prefill {INVARIANT_CHUNK_TOKENS}", f"prefill 25 after {INVARIANT_CHUNK_TOKENS} cached",
                    "decode 1 rows"}
        assert "decode 2 rows" not in report.phases_ms
    else:
        expected = {"prefill 256", "prefill 25 after 256 cached", "decode 1 rows", "decode 2 rows", "decode 4 rows",
                    "decode 8 rows"}
    assert expected | {"sampling", "chat template"} <= set(report.phases_ms)
    assert report.seconds > 0 and "warm-up took" in report.describe()
    warmed.check_integrity()
    assert _state(warmed) == _state(fresh)
    assert _state(warmed)["stats"]["cached_tokens"] == 0 and _state(warmed)["pool_is_zero"]


def test_a_warmed_engine_answers_as_a_fresh_one(make_engine, tiny_loaded):
    fresh = make_engine(**CONFIG)
    warmed = Engine(EngineConfig(**CONFIG), tiny_loaded)
    warm_up(warmed)
    warmed.start()
    try:
        request = GenerationRequest(tuple(range(40, 140)), SamplingParams(max_tokens=8, temperature=0.0))
        fresh_report, fresh_text, fresh_end = run(run_to_end(fresh, request))
        report, text, end = run(run_to_end(warmed, request))
        assert (report.matched_tokens, text, end.completion_tokens) == (0, fresh_text, fresh_end.completion_tokens)
        assert warmed.cache_stats()["requests_total"] == 1  # the warm-up was never a request
        warmed.check_integrity()
    finally:
        warmed.stop()


def test_a_stop_before_ready_ends_the_warm_up_and_gives_its_slots_back(tiny_loaded):
    engine = Engine(EngineConfig(**CONFIG), tiny_loaded)
    calls = []

    def stop_at_the_third_phase() -> bool:
        calls.append(1)
        return len(calls) >= 3

    try:
        warm_up(engine, should_stop=stop_at_the_third_phase)
        raise AssertionError("the warm-up should have stopped")
    except WarmUpStopped:
        pass
    assert engine.allocator.free_slot_ids().tolist() == list(range(engine.allocator.num_slots))
    assert bool((engine.pool.k == 0).all())
    engine.check_integrity()


def test_health_is_not_ready_until_the_warm_up_has_finished(tiny_loaded, monkeypatch):
    gate, entered = threading.Event(), threading.Event()
    real_warm_up = shutdown.warm_up

    def held_warm_up(engine, should_stop):
        entered.set()
        assert gate.wait(30)
        return real_warm_up(engine, should_stop)

    monkeypatch.setattr(shutdown, "warm_up", held_warm_up)
    engine = Engine(EngineConfig(**CONFIG), tiny_loaded)
    ready = threading.Event()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine, ServerConfig(port=port), ready=ready),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    starter = EngineStarter(engine, ready, lambda: server.should_exit, lambda: None)
    starter.start()
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: server.started and entered.is_set(), timeout_s=30)
        health = httpx.get(base + "/health", timeout=10)
        assert (health.status_code, health.json()["status"]) == (503, "starting")
        assert not starter.started  # the engine's worker waits for the warm-up
        gate.set()
        assert wait_until(ready.is_set, timeout_s=60)
        health = httpx.get(base + "/health", timeout=10)
        assert (health.status_code, health.json()["status"]) == (200, "ok")
        answer = httpx.post(base + "/v1/completions", timeout=60,
                            json={"model": "tiny-llama", "prompt": [5, 6, 7], "max_tokens": 2})
        assert answer.status_code == 200
        assert answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert engine.cache_stats()["requests_total"] == 1
    finally:
        gate.set()
        server.should_exit = True
        thread.join(timeout=10)
        starter.join(30)
        engine.stop()


def test_a_pool_too_small_for_the_full_sizes_is_warmed_within_it(tiny_loaded):
    engine = Engine(EngineConfig(kv_cache_tokens=48, max_num_batched_tokens=512, max_num_seqs=32), tiny_loaded)
    report = warm_up(engine)
    assert any(name.startswith("prefill ") for name in report.phases_ms)
    assert engine.allocator.free_slot_ids().tolist() == list(range(48))
    assert torch.count_nonzero(engine.pool.k) == 0
    engine.check_integrity()
