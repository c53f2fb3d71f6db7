"""The demo's simulated engine with a host tier: pages the device evicts are demoted to the host tier and loaded back
when used; pages the host tier evicts are dropped (an `evicted` miss); both tiers expire; the matched tokens split
over the tiers add up to the match. Its tier report is the real engine's, and the gateway reads it back."""

from __future__ import annotations

import random

import pytest

from gateway.demo.engine_model import (
    HOST_LOAD_MS_PER_TOKEN,
    PAGE_TOKENS,
    Rendered,
    SimulatedEngine,
    local_engine_response,
    render,
)
from gateway.explain.segments import chat_segments
from gateway.upstreams.kinds import LocalEngineAdapter
from gateway.upstreams.tiers import TierSplit

_WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def _text(seed: str, chars: int) -> str:
    rng = random.Random(seed)
    words: list[str] = []
    while sum(len(word) + 1 for word in words) < chars:
        words.append(rng.choice(_WORDS))
    return " ".join(words)[:chars]


def _prompt(content: str) -> Rendered:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return render("upstream/model/salt", chat_segments(body))


def _split(engine: SimulatedEngine, rendered: Rendered, now: float) -> tuple[int, int, int]:
    match = engine.match(rendered, now)
    assert match.device_tokens + match.host_tokens == match.matched_tokens
    return match.matched_tokens, match.device_tokens, match.host_tokens


A, B, C = (_prompt(_text(name, 330)) for name in "ABC")


def _branch_of_a() -> Rendered:
    """A prompt whose first two pages are A's, and whose third chunk starts like A's then differs."""
    content = _text("A", 330)
    shared = 2 * PAGE_TOKENS * 4 - A.text.index(content) + 20  # characters of A's content: two pages and a bit
    return _prompt(content[:shared] + " " + _text("D", 200))


def test_prompts_are_six_chunks() -> None:
    for rendered in (A, B, C):
        assert len(rendered.ids) == 6 and len(rendered.pages) == 5  # five full pages and a short last chunk


def test_without_a_host_tier_evicted_pages_are_dropped() -> None:
    engine = SimulatedEngine(6, 100.0)
    engine.serve(A, 0.0)
    assert _split(engine, A, 1.0) == (A.prompt_tokens - 1, A.prompt_tokens - 1, 0)
    engine.serve(B, 1.0)
    match = engine.match(A, 2.0)
    assert (match.matched_tokens, match.miss_kind, match.host_tokens, match.load_ms) == (0, "evicted", 0, 0.0)


def test_evicted_pages_are_demoted_to_the_host_tier_and_loaded_back() -> None:
    engine = SimulatedEngine(6, 100.0, host_capacity_pages=20)
    engine.serve(A, 0.0)
    engine.serve(B, 1.0)  # A's six chunks go to the host tier
    match = engine.match(A, 2.0)
    assert match.miss_kind == "hit" and match.matched_tokens == A.prompt_tokens - 1  # the last token is recomputed
    assert (match.device_tokens, match.host_tokens) == (0, A.prompt_tokens - 1)
    assert match.load_ms == pytest.approx(match.host_tokens * HOST_LOAD_MS_PER_TOKEN) and match.load_ms > 0
    assert engine.serve(A, 2.0) == match  # serving reports the match before it loads A back...
    assert _split(engine, A, 3.0) == (A.prompt_tokens - 1, A.prompt_tokens - 1, 0)  # ...then A is on the device
    assert _split(engine, B, 3.0) == (B.prompt_tokens - 1, 0, B.prompt_tokens - 1)  # and B was demoted in its place


def test_a_match_walks_the_chain_across_both_tiers() -> None:
    engine = SimulatedEngine(6, 100.0, host_capacity_pages=20)
    engine.serve(A, 0.0)
    engine.serve(B, 1.0)  # A on the host
    branch = _branch_of_a()
    assert branch.ids[:2] == A.ids[:2] and branch.ids[2] != A.ids[2]
    engine.serve(branch, 2.0)  # loads just A's first two pages back to the device
    matched, device, host = _split(engine, A, 3.0)
    assert matched == A.prompt_tokens - 1
    assert (device, host) == (2 * PAGE_TOKENS, matched - 2 * PAGE_TOKENS)


def test_a_partial_page_match_on_the_host_tier_counts_as_host() -> None:
    engine = SimulatedEngine(6, 100.0, host_capacity_pages=20)
    content = _text("A", 330)
    engine.serve(A, 0.0)
    engine.serve(B, 1.0)  # A on the host
    edited = _prompt(content[:200] + "X" + content[201:])  # differs inside A's fourth chunk
    match = engine.match(edited, 2.0)
    assert match.miss_kind == "partial"
    assert 3 * PAGE_TOKENS < match.matched_tokens < 4 * PAGE_TOKENS  # three pages and part of the fourth
    assert (match.device_tokens, match.host_tokens) == (0, match.matched_tokens)


def test_pages_the_host_tier_evicts_are_dropped_as_evicted() -> None:
    engine = SimulatedEngine(6, 100.0, host_capacity_pages=6)
    engine.serve(A, 0.0)
    engine.serve(B, 1.0)  # A to the host tier
    engine.serve(C, 2.0)  # B to the host tier, which drops A
    match = engine.match(A, 3.0)
    assert (match.matched_tokens, match.miss_kind, match.device_tokens, match.host_tokens) == (0, "evicted", 0, 0)
    assert _split(engine, B, 3.0) == (B.prompt_tokens - 1, 0, B.prompt_tokens - 1)
    assert _split(engine, C, 3.0) == (C.prompt_tokens - 1, C.prompt_tokens - 1, 0)


def test_pages_expire_on_the_host_tier() -> None:
    engine = SimulatedEngine(6, 10.0, host_capacity_pages=20)
    engine.serve(A, 0.0)
    engine.serve(B, 1.0)  # A demoted, last used at 0
    assert _split(engine, A, 9.0) == (A.prompt_tokens - 1, 0, A.prompt_tokens - 1)
    match = engine.match(A, 10.5)
    assert (match.matched_tokens, match.miss_kind, match.host_tokens) == (0, "expired", 0)
    assert _split(engine, B, 10.5) == (B.prompt_tokens - 1, B.prompt_tokens - 1, 0)  # on the device, used at 1
    assert engine.match(B, 11.5).miss_kind == "expired"  # the device's pages expire too
    # Expired pages are gone: serving A again caches it afresh on the device.
    assert engine.serve(A, 12.0).miss_kind == "expired"
    assert _split(engine, A, 13.0) == (A.prompt_tokens - 1, A.prompt_tokens - 1, 0)


def test_the_two_tiers_hold_what_one_lru_cache_of_their_size_would() -> None:
    """Matches, miss kinds and divergence are those of a single-level cache of the same total size, and the split
    always adds up; without a host tier everything is on the device."""
    rng = random.Random(3)
    bases = [_text(f"base{index}", 400) for index in range(4)]
    prompts = [_prompt(rng.choice(bases)[: rng.randrange(60, 400)] + _text(f"tail{index}", rng.randrange(0, 120)))
               for index in range(24)]
    tiered = SimulatedEngine(8, 40.0, host_capacity_pages=24)
    single = SimulatedEngine(32, 40.0)
    device_only = SimulatedEngine(8, 40.0)
    host_seen = device_seen = 0
    now = 0.0
    for _ in range(600):
        now += rng.choice((0.5, 1.0, 2.0, 30.0))
        rendered = rng.choice(prompts)
        for engine in (tiered, single, device_only):
            match = engine.match(rendered, now)
            assert match.device_tokens + match.host_tokens == match.matched_tokens
        ours, theirs = tiered.serve(rendered, now), single.serve(rendered, now)
        assert ours.device_tokens + ours.host_tokens == ours.matched_tokens
        assert (ours.matched_tokens, ours.miss_kind, ours.segment, ours.char_offset) == (
            theirs.matched_tokens, theirs.miss_kind, theirs.segment, theirs.char_offset)
        assert (theirs.device_tokens, theirs.host_tokens) == (theirs.matched_tokens, 0)
        alone = device_only.serve(rendered, now)
        assert (alone.device_tokens, alone.host_tokens) == (alone.matched_tokens, 0)
        host_seen += ours.host_tokens
        device_seen += ours.device_tokens
    assert host_seen > 0 and device_seen > 0


def test_a_host_tier_of_negative_size_is_refused() -> None:
    with pytest.raises(ValueError):
        SimulatedEngine(6, 10.0, host_capacity_pages=-1)


def test_the_tier_report_is_the_real_engine_s_and_the_gateway_reads_it() -> None:
    from local_engine.cache import MissKind
    from local_engine.cache.tiers import TierTokens
    from local_engine.api.match_details import MatchDetails

    engine = SimulatedEngine(6, 100.0, host_capacity_pages=20)
    engine.serve(A, 0.0)
    engine.serve(B, 1.0)
    engine.serve(_branch_of_a(), 2.0)
    match = engine.serve(A, 3.0)
    assert match.device_tokens > 0 and match.host_tokens > 0
    headers, body = local_engine_response(match, 7, 25.0, with_chain=False)

    real = MatchDetails(match.prompt_tokens, match.matched_tokens, MissKind(match.miss_kind), 3,
                        tier_tokens=TierTokens(match.device_tokens, match.host_tokens, 0), load_ms=match.load_ms)
    assert headers["x-prefix-cache-tiers"] == real.headers()["x-prefix-cache-tiers"]
    assert TierTokens.parse_header(headers["x-prefix-cache-tiers"]) == real.tiers
    expected = real.as_dict()
    assert {name: body["prefix_cache"][name] for name in ("tiers", "load_ms")} == {
        name: expected[name] for name in ("tiers", "load_ms")}

    adapter = LocalEngineAdapter()
    split = TierSplit(match.device_tokens, match.host_tokens, 0)
    assert adapter.cache_report(headers).tiers == split
    usage = adapter.usage(body)
    assert usage.tiers == split and usage.cached_tokens == match.matched_tokens
    assert usage.cache_load_ms == pytest.approx(match.host_tokens * HOST_LOAD_MS_PER_TOKEN, abs=1e-3)

    # Everything on the device: the engine still reports its tiers, with no load time.
    headers, body = local_engine_response(engine.match(A, 4.0), 7, 25.0, with_chain=False)
    assert headers["x-prefix-cache-tiers"] == f"device={A.prompt_tokens - 1},host=0,disk=0"
    assert body["prefix_cache"]["load_ms"] == 0.0
