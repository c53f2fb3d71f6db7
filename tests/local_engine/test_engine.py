"""The engine's request flow on a tiny random Llama: reuse, isolation, pressure, concurrency, cancellation."""

from __future__ import annotations

import asyncio

import pytest
import torch

from local_engine.cache import KVPool, MissKind, SlotAllocator
from local_engine.engine.types import GenerationRequest
from local_engine.errors import CapacityExceeded, InvalidRequest
from local_engine.model.runner import ModelRunner, ScheduledChunk
from local_engine.engine.sampling import SamplingParams

from .conftest import build_tiny_llama, run_to_end

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def prompt(seed: int, length: int = 120, vocab: int = 49152) -> tuple[int, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(10, vocab, (length,), generator=generator).tolist())


def test_suffix_logits_on_cached_kv_equal_a_full_recompute():
    model = build_tiny_llama(vocab_size=512, num_layers=3)
    pool_config = ModelRunner.pool_config_for(model, torch.device("cpu"), torch.float32)
    runner = ModelRunner(model, KVPool(pool_config, 512))
    slots = SlotAllocator(512).alloc(200)
    tokens = prompt(1, 200, vocab=512)
    full_logits = model(input_ids=torch.tensor([tokens])).logits[0]
    runner.forward([ScheduledChunk(tokens, slots, True)])
    for matched in (1, 77, 199):
        # Each suffix token on top of the pool's KV of the tokens before it.
        for end in range(matched + 1, 201):
            logits = runner.forward([ScheduledChunk(tokens[matched:end], slots[:end], True)])
            assert (logits[0] - full_logits[end - 1]).abs().max().item() <= 1e-4


def test_greedy_output_is_identical_cold_and_warm(make_engine):
    engine = make_engine(kv_cache_tokens=4096)

    async def scenario():
        cold = await run_to_end(engine, GenerationRequest(prompt(1), GREEDY))
        warm = await run_to_end(engine, GenerationRequest(prompt(1), GREEDY))
        return cold, warm

    (cold_report, cold_text, cold_end), (warm_report, warm_text, warm_end) = asyncio.run(scenario())
    assert cold_report.matched_tokens == 0 and cold_report.miss_kind is MissKind.COLD
    assert warm_report.matched_tokens == 119 and warm_report.miss_kind is MissKind.HIT
    assert warm_end.cached_tokens == 119
    assert cold_text == warm_text and cold_end.completion_tokens == warm_end.completion_tokens == 8
    engine.check_integrity()


def test_a_follow_up_turn_reuses_the_previous_answer(make_engine):
    engine = make_engine(kv_cache_tokens=4096)

    async def scenario():
        first = await run_to_end(engine, GenerationRequest(prompt(2), GREEDY))
        handle = await engine.submit(GenerationRequest(prompt(2), GREEDY))
        async for _ in handle.stream():
            pass
        return first

    asyncio.run(scenario())
    # prompt + 7 of the 8 generated tokens (the last one's KV is never computed) are indexed.
    assert engine.cache.cached_tokens == 120 + 7


def test_salts_isolate_namespaces(make_engine):
    engine = make_engine(kv_cache_tokens=4096)

    async def scenario():
        await run_to_end(engine, GenerationRequest(prompt(3), GREEDY, namespace="salt-a"))
        other = await run_to_end(engine, GenerationRequest(prompt(3), GREEDY, namespace="salt-b"))
        same = await run_to_end(engine, GenerationRequest(prompt(3), GREEDY, namespace="salt-a"))
        return other[0], same[0]

    other, same = asyncio.run(scenario())
    assert other.matched_tokens == 0
    assert same.matched_tokens > 0


def test_pressure_all_requests_succeed_within_capacity_and_report_evicted(make_engine):
    engine = make_engine(kv_cache_tokens=400)
    prompts = [prompt(10 + i, 150) for i in range(4)]  # 4 x ~158 tokens > 400 slots

    async def scenario():
        reports = []
        for p in prompts + prompts[:1]:
            report, _, finished = await run_to_end(engine, GenerationRequest(p, GREEDY))
            assert finished.finish_reason == "length"
            assert engine.allocator.num_free >= 0
            engine.check_integrity()
            reports.append(report)
        return reports

    reports = asyncio.run(scenario())
    assert all(r.matched_tokens == 0 for r in reports[:4])
    assert reports[4].miss_kind is MissKind.EVICTED
    assert engine.cache.stats().evicted_tokens_total > 0


def test_concurrent_requests_are_all_answered_as_if_alone(make_engine):
    engine = make_engine(kv_cache_tokens=8192, max_num_seqs=4)
    prompts = [prompt(20 + i % 3, 60 + i) for i in range(9)]

    async def alone():
        return [(await run_to_end(engine, GenerationRequest(p, GREEDY)))[1] for p in prompts]

    async def together():
        results = await asyncio.gather(*(run_to_end(engine, GenerationRequest(p, GREEDY)) for p in prompts))
        return [text for _, text, _ in results]

    expected = asyncio.run(alone())
    engine.flush_cache()
    assert asyncio.run(together()) == expected
    engine.check_integrity()
    assert engine.cache.protected_tokens == 0


def test_cancelling_mid_generation_releases_locks_and_slots(make_engine):
    engine = make_engine(kv_cache_tokens=4096)

    async def scenario():
        handle = await engine.submit(GenerationRequest(prompt(30), SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)))
        async for _ in handle.stream():
            handle.cancel()
        # the Finished event arrives with reason "cancelled"
        return handle

    asyncio.run(scenario())
    engine.check_integrity()
    assert engine.cache.protected_tokens == 0
    assert engine.cache_stats()["active_requests"] == 0


def test_a_prompt_larger_than_the_pool_is_refused_and_the_engine_keeps_serving(make_engine):
    engine = make_engine(kv_cache_tokens=100)

    async def scenario():
        with pytest.raises(CapacityExceeded):
            await engine.submit(GenerationRequest(prompt(40, 150), GREEDY))
        return await run_to_end(engine, GenerationRequest(prompt(41, 50), GREEDY))

    report, _, finished = asyncio.run(scenario())
    assert finished.finish_reason == "length"
    engine.check_integrity()


def test_prompt_plus_max_tokens_past_the_window_is_invalid(make_engine):
    engine = make_engine(kv_cache_tokens=1000)
    window = engine.loaded.context_window_tokens

    async def scenario():
        await engine.submit(GenerationRequest(prompt(1, 10), SamplingParams(max_tokens=window)))

    with pytest.raises(InvalidRequest):
        asyncio.run(scenario())


def test_seeded_sampling_is_reproducible_and_stop_strings_end_the_answer(make_engine):
    engine = make_engine(kv_cache_tokens=4096)
    seeded = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True)

    async def scenario():
        first = await run_to_end(engine, GenerationRequest(prompt(50), seeded))
        second = await run_to_end(engine, GenerationRequest(prompt(50), seeded))
        stop_at = first[1][3:6]
        stopped = await run_to_end(
            engine, GenerationRequest(prompt(50), SamplingParams(**{**seeded.__dict__, "stop": (stop_at,)}))
        )
        return first[1], second[1], stopped, stop_at, first[2]

    first, second, stopped, stop_at, unstopped = asyncio.run(scenario())
    assert first == second
    _, stopped_text, finished = stopped
    assert finished.finish_reason == "stop"
    assert finished.matched_stop == stop_at
    assert unstopped.matched_stop is None  # ended by max_tokens
    assert stop_at not in stopped_text and first.startswith(stopped_text)


def test_page_size_16_engine_reuses_whole_pages(make_engine):
    engine = make_engine(kv_cache_tokens=4096, page_size=16)

    async def scenario():
        await run_to_end(engine, GenerationRequest(prompt(60, 100), GREEDY))
        return await run_to_end(engine, GenerationRequest(prompt(60, 100), GREEDY))

    report, _, _ = asyncio.run(scenario())
    assert report.matched_tokens == 96 and report.miss_kind is MissKind.HIT
    engine.check_integrity()


def test_no_prefix_cache_baseline_never_hits(make_engine):
    engine = make_engine(kv_cache_tokens=4096, prefix_cache=False)

    async def scenario():
        await run_to_end(engine, GenerationRequest(prompt(70), GREEDY))
        return await run_to_end(engine, GenerationRequest(prompt(70), GREEDY))

    report, _, _ = asyncio.run(scenario())
    assert report.matched_tokens == 0
    engine.check_integrity()


def test_requests_of_different_sizes_share_steps(make_engine):
    engine = make_engine(kv_cache_tokens=8192, max_num_seqs=4)
    sizes = [(40, 300), (200, 8), (90, 50), (10, 600), (120, 20)]

    async def scenario():
        results = await asyncio.gather(
            *(run_to_end(engine, GenerationRequest(prompt(80 + n, n), SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))) for n, m in sizes)
        )
        assert [f.completion_tokens for _, _, f in results] == [m for _, m in sizes]

    asyncio.run(scenario())
    # One step per token of the longest answer would be the serial count; batched steps need far fewer.
    assert engine.num_steps < sum(m for _, m in sizes)
    assert not hasattr(engine.runner, "_idle_buffers")  # no per-request working copy of the KV exists
    engine.check_integrity()


def test_decode_steps_are_counted_phase_by_phase(make_engine):
    alone, together = make_engine(kv_cache_tokens=4096), make_engine(kv_cache_tokens=4096)

    async def one():
        await run_to_end(alone, GenerationRequest(prompt(1), GREEDY))

    async def two():
        await asyncio.gather(*(run_to_end(together, GenerationRequest(prompt(seed), GREEDY)) for seed in (2, 3)))

    asyncio.run(one())
    asyncio.run(two())
    for engine in (alone, together):
        engine.stop()  # the worker counts a step after handing out its tokens: read the counters once it is done
    # A request's prompt step samples its first token; its other 7 come from decode-only steps, which two requests
    # share in some steps and take alone in others.
    assert alone.counters.decode_steps.steps == 7
    assert 7 <= together.counters.decode_steps.steps <= 14
    phases = together.counters.decode_steps
    assert min(phases.schedule_s, phases.forward_s, phases.sample_s, phases.emit_s) > 0
    per_step = phases.per_step_ms()
    assert set(per_step) == {"schedule", "forward", "sample", "emit", "step"}
    parts = per_step["schedule"] + per_step["forward"] + per_step["sample"] + per_step["emit"]
    assert per_step["step"] == pytest.approx(parts, abs=0.01)
    assert phases.since(phases).steps == 0 and phases.since(type(phases)()).steps == phases.steps
