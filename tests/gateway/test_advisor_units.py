"""The rule advisor's parts without an engine: candidates, the estimate against a toy engine whose tokens are the
characters of the rendered prompt, the approximate estimate for other upstreams, and the sampler's bounds."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
import pytest

from db.records import RequestRecord
from gateway.advisor.capacity import AdvisorCapacity
from gateway.advisor.candidates import candidates_for, settings_fingerprint
from gateway.advisor.estimate import DEFAULT_SCAN_LIMIT, AdviceJob, Estimator, common_prefix
from gateway.advisor.history import Entry
from gateway.advisor.metered import Metered
from gateway.advisor.sampler import AdviceSampler
from gateway.config import SEMANTIC_RULES, TenantSettings, UpstreamConfig
from gateway.explain.chains import canonical_prompt_text
from gateway.explain.explainer import ExplainContext
from gateway.normalize.pipeline import NormalizationResult, Pipeline, build_pipeline
from gateway.parsing import CHAT
from gateway.upstreams.route import build_route

STATIC = "You are a helpful assistant for a bicycle shop. Answer briefly and never invent order numbers. " * 3
ENGINE = build_route(UpstreamConfig(name="engine", url="http://engine.test", kind="local_engine"))
OTHER = build_route(UpstreamConfig(name="hosted", url="http://hosted.test", kind="openai"))


def body(stamp: str, *turns: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": f"Current time: {stamp}\n{STATIC}"}]
    messages += [{"role": ("user", "assistant")[i % 2], "content": text} for i, text in enumerate(turns)]
    return {"model": "m", "messages": messages}


def char_chain(text: str) -> list[int]:
    """The toy engine's hash chain: one block per character."""
    previous, chain = b"", []
    for char in text:
        previous = hashlib.blake2b(previous + char.encode(), digest_size=8).digest()
        chain.append(int.from_bytes(previous, "big") >> 1)
    return chain


def toy_engine(requests: list[dict[str, Any]]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        payload = msgspec.json.decode(request.content)
        requests.append(payload)
        text = canonical_prompt_text(CHAT, payload)
        return httpx.Response(200, json={"matched_tokens": 0, "hash_chain": {"hash_ids": char_chain(text)}})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def test_candidates_are_the_rules_and_settings_not_on() -> None:
    assert [c.key for c in candidates_for(TenantSettings())] == ["hoist_volatile:after_system", "hoist_volatile:end"]
    off = candidates_for(TenantSettings(rules=frozenset()))
    hoisting_keys = ["hoist_volatile:after_system", "hoist_volatile:end"]
    assert [c.key for c in off] == [*SEMANTIC_RULES, "default_rules", *hoisting_keys]
    assert off[4].settings.rules == frozenset(SEMANTIC_RULES)
    assert off[6].settings.rules == frozenset({"hoist_volatile"}) and off[6].settings.hoist_placement == "end"
    hoisting = TenantSettings(rules=frozenset({*SEMANTIC_RULES, "hoist_volatile"}), hoist_placement="after_system")
    (other,) = candidates_for(hoisting)
    assert other.key == "hoist_placement:end" and other.settings.hoist_placement == "end"
    one_off = TenantSettings(rules=frozenset(SEMANTIC_RULES) - {"newlines"})
    assert [c.key for c in candidates_for(one_off)][0] == "newlines" and len(candidates_for(one_off)) == 3


def _job(
    route: Any, settings: TenantSettings, earlier: list[dict], current: dict, cached: int, prompt: int
) -> AdviceJob:
    pipeline = build_pipeline(settings)
    entries = tuple(Entry(CHAT, raw, pipeline.apply(raw).request) for raw in earlier)
    return AdviceJob(
        endpoint=CHAT,
        raw_body=current,
        body=pipeline.apply(current).request,
        salt="salt",
        route=route,
        hash_block_size=settings.hash_block_size,
        prompt_tokens=prompt,
        cached_tokens=cached,
        earlier=entries,
        candidates=tuple((c, build_pipeline(c.settings)) for c in candidates_for(settings)),
    )


def test_estimate_with_the_engine_dry_run_is_actual_plus_the_shared_prefix_difference() -> None:
    earlier = [body("2025-06-01T10:00:00Z", "Hi"), body("2025-06-01T10:01:00Z", "Hi", "Hello!", "Is it open?")]
    current = body("2025-06-01T10:02:00Z", "Hi", "Hello!", "Is it open?", "Yes.", "When?")
    text = canonical_prompt_text(CHAT, current)
    settings = TenantSettings()
    seen: list[dict] = []
    client = toy_engine(seen)
    job = _job(ENGINE, settings, earlier, current, cached=20, prompt=len(text))
    outcomes = asyncio.run(Estimator(job, client, httpx.Timeout(5)).outcomes())

    actual_shared = max(len(os.path.commonprefix([text, canonical_prompt_text(CHAT, e.body)])) for e in job.earlier)
    expected = {}
    for candidate, pipeline in job.candidates:
        mine = canonical_prompt_text(CHAT, pipeline.apply(current).request)
        shared = max(
            len(os.path.commonprefix([mine, canonical_prompt_text(CHAT, pipeline.apply(e.raw_body).request)]))
            for e in job.earlier
        )
        expected[candidate.key] = (len(mine), min(20 + shared - actual_shared, len(mine) - 1))
    assert {o.candidate: (o.prompt_tokens, o.cached_tokens) for o in outcomes} == expected
    assert all(o.changed for o in outcomes)
    # Either placement keeps the system prompt (and here the earlier turns' text) cacheable.
    assert min(expected["hoist_volatile:end"][1], expected["hoist_volatile:after_system"][1]) > 300
    assert all(payload["cache_salt"] == "salt" and payload["hash_block_size"] == 1 for payload in seen)
    assert len({msgspec.json.encode(p) for p in seen}) == len(seen)  # each prompt dry-run once


def test_a_rule_that_changes_nothing_costs_no_dry_run_and_estimates_the_actual() -> None:
    earlier = [{"model": "m", "messages": [{"role": "system", "content": STATIC}, {"role": "user", "content": "Hi"}]}]
    current = {"model": "m", "messages": [{"role": "system", "content": STATIC}, {"role": "user", "content": "Hey"}]}
    seen: list[dict] = []
    job = _job(ENGINE, TenantSettings(), earlier, current, cached=30, prompt=60)
    outcomes = asyncio.run(Estimator(job, toy_engine(seen), httpx.Timeout(5)).outcomes())
    assert [(o.candidate, o.prompt_tokens, o.cached_tokens, o.changed) for o in outcomes] == [
        ("hoist_volatile:after_system", 60, 30, False),
        ("hoist_volatile:end", 60, 30, False),
    ]
    assert seen == []


def test_approximate_estimate_for_upstreams_without_a_dry_run() -> None:
    earlier = [body("2025-06-01T10:00:00Z", "Hi", "Hello!", "Is it open?")]
    current = body("2025-06-01T10:02:00Z", "Hi", "Hello!", "Is it open?", "Yes.", "When?")
    settings = TenantSettings(hash_block_size=4)
    text = canonical_prompt_text(CHAT, current)
    job = _job(OTHER, settings, earlier, current, cached=0, prompt=len(text) // 4)
    outcomes = {o.candidate: o for o in asyncio.run(Estimator(job, httpx.AsyncClient(), httpx.Timeout(5)).outcomes())}
    end = outcomes["hoist_volatile:end"]
    hoist = build_pipeline(replace(settings, rules=settings.rules | {"hoist_volatile"}, hoist_placement="end"))
    ratio = (len(text) // 4) / len(text)  # the request's own tokens per character

    def tokens(a: str, b: str) -> int:  # shared whole blocks of 4 tokens x 4 characters, in tokens
        return round(len(os.path.commonprefix([a, b])) // 16 * 16 * ratio)

    rewritten = canonical_prompt_text(CHAT, hoist.apply(current).request)
    assert end.prompt_tokens == round(len(rewritten) * ratio)
    shared = tokens(rewritten, canonical_prompt_text(CHAT, hoist.apply(earlier[0]).request))
    shared_as_sent = tokens(text, canonical_prompt_text(CHAT, job.earlier[0].body))
    assert end.cached_tokens == shared - shared_as_sent > 50
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2


def _context(tenant: str, settings: TenantSettings, raw: dict) -> ExplainContext:
    normalized = build_pipeline(settings).apply(raw).request
    context = ExplainContext(settings, CHAT, tenant, normalized, raw, "s", ENGINE, False)
    context.upstream_status = 200
    return context


def _record(**changes: Any) -> RequestRecord:
    values: dict[str, Any] = dict(
        request_id="r1",
        created_at=datetime(2025, 6, 1, tzinfo=UTC),
        tenant="t",
        key_id=None,
        endpoint=CHAT,
        model="m",
        upstream="engine",
        stream=False,
        status_code=200,
        error_type=None,
        prompt_tokens=100,
        cached_tokens=10,
        completion_tokens=1,
        ttft_ms=5.0,
        latency_ms=6.0,
    )
    return RequestRecord(**(values | changes))


def test_sampler_holds_sampled_records_until_their_estimate_is_done() -> None:
    async def scenario() -> tuple[list[RequestRecord], AdviceSampler]:
        submitted: list[RequestRecord] = []
        seen: list[dict] = []
        client = toy_engine(seen)
        sampler = AdviceSampler(lambda: client, max_pending=1)
        settings = TenantSettings(advice_sample_rate=1.0)
        first = body("2025-06-01T10:00:00Z", "Hi")
        assert sampler.observe(_context("t", settings, first), _record(request_id="a"), submitted.append)
        second = body("2025-06-01T10:01:00Z", "Hi", "Hello!", "Open?")
        # One estimate is already waiting: the next sampled request is skipped and submitted by the caller.
        assert not sampler.observe(_context("t", settings, second), _record(request_id="b"), submitted.append)
        assert sampler.skipped == 1
        unsampled = replace(settings, advice_sample_rate=0.0)
        assert not sampler.observe(_context("t", unsampled, second), _record(request_id="c"), submitted.append)
        failed = _context("t", settings, second)
        failed.upstream_status = 500
        assert not sampler.observe(failed, _record(request_id="d", status_code=502), submitted.append)
        await sampler.stop()
        return submitted, sampler

    submitted, sampler = asyncio.run(scenario())
    (record,) = submitted
    assert record.request_id == "a" and sampler.sampled == 1
    # The first request of a tenant has nothing earlier to share: the estimate is the actual figure.
    assert {(o.candidate, o.cached_tokens) for o in record.advice} == {
        ("hoist_volatile:after_system", 10),
        ("hoist_volatile:end", 10),
    }
    # Each estimate names the settings the request was served under.
    assert {o.settings for o in record.advice} == {settings_fingerprint(TenantSettings(advice_sample_rate=1.0))}
    # a and b were answered; c's settings turn advice off, so it is not remembered; d was not answered
    assert len(sampler.histories.for_tenant("t")) == 2


def test_a_tenant_with_advice_off_keeps_no_request_in_memory() -> None:
    async def scenario() -> AdviceSampler:
        submitted: list[RequestRecord] = []
        sampler = AdviceSampler(lambda: toy_engine([]))
        off = TenantSettings(advice_sample_rate=0.0)
        for minute in range(5):
            raw = body(f"2025-06-01T10:0{minute}:00Z", "Hi")
            assert not sampler.observe(_context("quiet", off, raw), _record(request_id=str(minute)), submitted.append)
        await sampler.stop()
        return sampler

    sampler = asyncio.run(scenario())
    assert len(sampler.histories.for_tenant("quiet")) == 0


def test_invalid_advice_sample_rate_is_a_config_error() -> None:
    from gateway.config import parse_config
    from gateway.errors import ConfigError

    assert parse_config({"tenant_defaults": {"advice_sample_rate": 0.5}}).tenant_defaults.advice_sample_rate == 0.5
    with pytest.raises(ConfigError, match="advice_sample_rate"):
        parse_config({"tenant_defaults": {"advice_sample_rate": 2}})


def test_settings_fingerprint_names_what_shapes_the_prompt() -> None:
    default = settings_fingerprint(TenantSettings())
    assert len(default) == 16 and default == settings_fingerprint(TenantSettings(advice_sample_rate=0.5))
    hoisting = TenantSettings(rules=frozenset({*SEMANTIC_RULES, "hoist_volatile"}))
    at_end = settings_fingerprint(replace(hoisting, hoist_placement="end"))
    assert settings_fingerprint(hoisting) not in {default, at_end}
    # The placement only matters while hoisting is on.
    assert settings_fingerprint(replace(TenantSettings(), hoist_placement="end")) == default


class CountingPipeline(Pipeline):
    """A pipeline that counts its rewrites and the threads they ran on."""

    def __init__(self, pipeline: Pipeline, log: list[int]) -> None:
        super().__init__(pipeline.rules)
        self._log = log

    def apply(self, request: dict[str, Any]) -> NormalizationResult:
        import threading

        self._log.append(threading.get_ident())
        return super().apply(request)


def test_one_sample_rewrites_a_bounded_share_of_the_history_off_the_event_loop() -> None:
    """A full history of 256 requests: a sample rewrites only the latest `DEFAULT_SCAN_LIMIT` of them (plus itself),
    once per candidate, in a worker thread; the next sample reuses those rewrites."""
    import threading

    settings = TenantSettings()
    earlier = [body(f"2025-06-01T10:{i // 60:02d}:{i % 60:02d}Z", "Hi", "Hello!", f"Turn {i}") for i in range(256)]
    calls: list[int] = []

    def job(current: dict[str, Any]) -> AdviceJob:
        plain = _job(ENGINE, settings, [], current, cached=20, prompt=100)
        counted = tuple((c, CountingPipeline(p, calls)) for c, p in plain.candidates)
        return replace(plain, earlier=entries, candidates=counted)

    pipeline = build_pipeline(settings)
    entries = tuple(Entry(CHAT, raw, pipeline.apply(raw).request) for raw in earlier)
    loop_threads: list[int] = []

    async def estimate(current: dict[str, Any]) -> None:
        loop_threads.append(threading.get_ident())
        await Estimator(job(current), toy_engine([]), httpx.Timeout(5)).outcomes()

    asyncio.run(estimate(body("2025-06-01T11:00:00Z", "Hi", "Hello!", "Next")))
    assert len(calls) == (DEFAULT_SCAN_LIMIT + 1) * 2  # two candidates: hoisting with each placement
    assert loop_threads[0] not in set(calls)
    calls.clear()
    asyncio.run(estimate(body("2025-06-01T11:01:00Z", "Hi", "Hello!", "Again")))
    assert len(calls) == 2  # only the new sample: the history's rewrites are kept per candidate


def test_sampler_samples_every_request_while_it_has_capacity_whatever_the_rate() -> None:
    async def scenario() -> tuple[list[RequestRecord], AdviceSampler]:
        submitted: list[RequestRecord] = []
        sampler = AdviceSampler(lambda: toy_engine([]))
        settings = TenantSettings(advice_sample_rate=0.1)  # above 0: advice on; the share no longer thins samples
        for minute in range(5):
            raw = body(f"2025-06-01T10:0{minute}:00Z", "Hi")
            assert sampler.observe(_context("quiet", settings, raw), _record(request_id=str(minute)), submitted.append)
            await asyncio.sleep(0)
        await sampler.stop()
        return submitted, sampler

    submitted, sampler = asyncio.run(scenario())
    assert sampler.sampled == 5 and sampler.skipped == 0
    assert all(record.advice for record in submitted)
    assert sampler.capacity.cpu_s_total > 0


def test_capacity_is_bounded_by_the_cpu_budget_over_its_window() -> None:
    now = [0.0]
    capacity = AdvisorCapacity(cpu_budget=0.1, window_s=10.0, max_pending=4, clock=lambda: now[0])
    assert capacity.has_room(0)
    capacity.charge(0.5)
    assert capacity.cpu_share() == pytest.approx(0.05) and capacity.has_room(3)
    assert not capacity.has_room(4)  # the concurrency limit
    capacity.charge(0.6)
    assert not capacity.has_room(0)  # 1.1 CPU seconds in 10 s: over 10% of a core
    now[0] = 10.5  # both charges left the window
    assert capacity.cpu_share() == 0.0 and capacity.has_room(0)
    assert capacity.cpu_s_total == pytest.approx(1.1)
    with pytest.raises(ValueError, match="cpu_budget"):
        AdvisorCapacity(cpu_budget=0)


def test_sampler_past_its_cpu_budget_samples_nothing_and_counts_it() -> None:
    async def scenario() -> AdviceSampler:
        sampler = AdviceSampler(lambda: toy_engine([]), cpu_budget=0.01, window_s=100.0)
        sampler.capacity.charge(5.0)  # an earlier burst used the whole budget
        raw = body("2025-06-01T10:00:00Z", "Hi")
        submitted: list[RequestRecord] = []
        settings = TenantSettings(advice_sample_rate=1.0)
        assert not sampler.observe(_context("busy", settings, raw), _record(request_id="x"), submitted.append)
        await sampler.stop()
        return sampler

    sampler = asyncio.run(scenario())
    assert sampler.skipped == 1 and sampler.sampled == 0
    assert len(sampler.histories.for_tenant("busy")) == 1  # still remembered for later samples


def burn_cpu(seconds: float) -> None:
    """Spend `seconds` of this thread's CPU time (a deterministic amount of work for the budget to charge)."""
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


def costly_engine(cpu_s_per_match: float) -> httpx.AsyncClient:
    """The toy engine, answering each dry run on the event loop after `cpu_s_per_match` CPU seconds of work."""

    def handler(request: httpx.Request) -> httpx.Response:
        burn_cpu(cpu_s_per_match)
        text = canonical_prompt_text(CHAT, msgspec.json.decode(request.content))
        return httpx.Response(200, json={"matched_tokens": 0, "hash_chain": {"hash_ids": char_chain(text)}})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def until_idle(sampler: AdviceSampler) -> None:
    while sampler.pending:
        await asyncio.sleep(0.001)


def test_a_busy_tenant_gets_no_more_samples_than_its_share_of_the_queue() -> None:
    """A burst of requests in one turn of the event loop: the busy tenant gets at most 3/4 of `max_pending` samples,
    the rest are skipped (their records submitted by the caller at once), and a quiet tenant's request in the middle
    of the burst still finds room; the sampled ones get their advice afterwards, one worker at a time."""

    async def scenario() -> tuple[list[bool], bool, list[RequestRecord], AdviceSampler, int]:
        submitted: list[RequestRecord] = []
        sampler = AdviceSampler(lambda: toy_engine([]), max_pending=8)
        settings = TenantSettings()

        def request(tenant: str, i: int) -> bool:
            raw = body(f"2025-06-01T10:00:{i:02d}Z", "Hi")
            return sampler.observe(_context(tenant, settings, raw), _record(request_id=f"{tenant}{i}"), submitted.append)

        busy = [request("busy", i) for i in range(10)]
        quiet = request("quiet", 0)
        busy += [request("busy", i) for i in range(10, 20)]
        pending = sampler.pending
        await until_idle(sampler)
        await sampler.stop()
        return busy, quiet, submitted, sampler, pending

    busy, quiet, submitted, sampler, pending = asyncio.run(scenario())
    assert busy == [True] * 6 + [False] * 14 and quiet and pending == 7
    assert sampler.sampled == 7 and sampler.skipped == 14
    assert sorted(r.request_id for r in submitted) == [f"busy{i}" for i in range(6)] + ["quiet0"]
    assert all(r.advice for r in submitted)
    assert len(sampler.histories.for_tenant("busy")) == 20  # every answered request is remembered


def test_the_budget_charges_the_event_loop_work_and_pauses_sampling_until_its_window_has_room() -> None:
    """Dry runs whose handling costs CPU on the event loop are charged to the budget: once one sample used more than
    the window allows, the next request is not sampled, until the window has moved on."""
    now = [1000.0]

    async def scenario() -> tuple[list[bool], AdviceSampler, list[RequestRecord]]:
        submitted: list[RequestRecord] = []
        engine = costly_engine(0.005)
        # 0.1% of a core over 10 s: 10 ms of CPU, less than one sample's dry runs (at least 3 x 5 ms)
        sampler = AdviceSampler(lambda: engine, cpu_budget=0.001, window_s=10.0, clock=lambda: now[0])
        settings = TenantSettings()
        taken = []

        def request(i: int) -> None:
            raw = body(f"2025-06-01T10:0{i}:00Z", "Hi")
            taken.append(sampler.observe(_context("t", settings, raw), _record(request_id=str(i)), submitted.append))

        request(0)
        await until_idle(sampler)
        assert sampler.capacity.cpu_s_total >= 0.015
        request(1)  # the window is over budget
        now[0] += 11.0  # the sample's charge has left the window
        request(2)
        await until_idle(sampler)
        await sampler.stop()
        return taken, sampler, submitted

    taken, sampler, submitted = asyncio.run(scenario())
    assert taken == [True, False, True]
    assert sampler.sampled == 2 and sampler.skipped == 1
    assert [r.request_id for r in submitted] == ["0", "2"] and all(r.advice for r in submitted)


def test_a_quiet_tenant_is_sampled_on_every_request() -> None:
    """Requests that come one at a time, each after the previous estimate is done: every one is sampled and advised,
    with the default budget, queue and worker."""

    async def scenario() -> tuple[list[RequestRecord], AdviceSampler]:
        submitted: list[RequestRecord] = []
        sampler = AdviceSampler(lambda: toy_engine([]))
        settings = TenantSettings()
        for minute in range(8):
            raw = body(f"2025-06-01T10:0{minute}:00Z", "Hi", "Hello!", f"Turn {minute}")
            assert sampler.observe(_context("quiet", settings, raw), _record(request_id=str(minute)), submitted.append)
            await until_idle(sampler)
        await sampler.stop()
        return submitted, sampler

    submitted, sampler = asyncio.run(scenario())
    assert sampler.sampled == 8 and sampler.skipped == 0 and sampler.failed == 0
    assert [r.request_id for r in submitted] == [str(m) for m in range(8)] and all(r.advice for r in submitted)


def test_capacity_paces_estimates_in_proportion_to_their_cpu() -> None:
    now = [0.0]
    capacity = AdvisorCapacity(cpu_budget=0.25, window_s=10.0, clock=lambda: now[0])
    assert capacity.rest_s() == 0.0
    capacity.charge(0.01)  # at a quarter of a core, 10 ms of work is followed by 30 ms of rest
    assert capacity.rest_s() == pytest.approx(0.03)
    now[0] = 0.02
    assert capacity.rest_s() == pytest.approx(0.01)
    now[0] = 0.05
    assert capacity.rest_s() == 0.0
    assert capacity.rest_after(100.0) == 10.0  # never longer than the window


def test_metered_counts_a_coroutines_own_steps_and_passes_results_errors_and_cancellation() -> None:
    async def work(fail: bool) -> str:
        burn_cpu(0.01)
        await asyncio.sleep(0.2)  # waiting is not charged
        burn_cpu(0.01)
        if fail:
            raise LookupError("no")
        return "done"

    async def scenario() -> None:
        metered = Metered(work(False))
        assert await metered == "done"
        assert 0.02 <= metered.cpu_s < 0.1
        with pytest.raises(LookupError):
            await Metered(work(True))
        task = asyncio.ensure_future(Metered(asyncio.sleep(10)))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
