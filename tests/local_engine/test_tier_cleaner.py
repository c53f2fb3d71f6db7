"""The write-back cleaner: idle time gives the device nodes next in line for eviction a host copy, so a later
eviction only gives device slots back; the counts and the per-tier integrity stay right."""

from __future__ import annotations

import asyncio
import time

from local_engine.cache.tiers.cleaner import clean, dirty_nodes
from local_engine.cache.tiers import TierTokens
from local_engine.engine.types import GenerationRequest

from .conftest import run_to_end
from .test_tiers_engine import GREEDY, PROMPTS, expected  # noqa: F401 (a fixture)
from .tier_fixtures import FakeClock, admit, assert_kv, release, store, tiered_cache

A = list(range(100, 130))  # 30 tokens
B = list(range(200, 230))


def test_cleaning_copies_the_lru_tail_down_and_a_later_eviction_needs_no_copy():
    clock = FakeClock()
    cache = tiered_cache(device_tokens=40, host_tokens=64, clock=clock)
    store(cache, "ns", A)
    assert [node.num_tokens for node in dirty_nodes(cache)] == [30]
    assert clean(cache) == 30
    cache.check_integrity()
    (node,) = [n for n in cache.roots()["ns"].children.values()]
    host_copy = node.host_slots
    assert host_copy is not None and node.slots is not None  # both copies; the device one is still served
    assert cache.match("ns", A + [1], dry_run=True).tier_tokens == TierTokens(device=30, host=0, disk=0)
    assert cache.tier_stats()["device"]["demoted_tokens_total"] == 0  # nothing left the device yet
    assert clean(cache) == 0  # nothing dirty is left

    clock.now += 1
    store(cache, "ns", B)  # evicts A from the device: its host copy is already there
    assert node.slots is None and node.host_slots is host_copy
    cache.check_integrity()
    stats = cache.tier_stats()
    assert stats["device"]["demoted_tokens_total"] == 30  # counted once, when it left the device
    assert cache.tiers.cleaned_tokens_total == 30
    match, own = admit(cache, "ns", A + [1])
    assert match.tier_tokens == TierTokens(0, 30, 0)
    assert_kv(cache.tiers.device_pool, match.slots, "ns", A)
    release(cache, match, own)
    cache.check_integrity()


def test_cleaning_is_bounded_skips_locked_nodes_and_never_pushes_out_newer_host_copies():
    clock = FakeClock()
    cache = tiered_cache(device_tokens=80, host_tokens=30, clock=clock)
    store(cache, "ns", A)
    clock.now += 1
    store(cache, "ns", B)
    assert clean(cache, max_tokens=10) == 30  # one node at least, then the bound stops it
    cache.check_integrity()
    # The host is full with A (older); B is newer, so A's host copy may make room for it.
    assert clean(cache) == 30
    cache.check_integrity()
    roots = cache.roots()["ns"].children.values()
    by_first = {n.key[0]: n for n in roots}
    assert by_first[200].host_slots is not None and by_first[100].host_slots is None
    # Now B (newer) holds the host: cleaning A again would push a newer copy out, so it does not.
    assert clean(cache) == 0
    match, own = admit(cache, "ns", B + [1])  # locked nodes are never cleaned or pushed out
    assert clean(cache) == 0
    release(cache, match, own)
    cache.check_integrity()


def test_an_idle_engine_cleans_and_answers_stay_the_same(make_engine, expected):
    engine = make_engine(kv_cache_tokens=300, host_cache_tokens=600)

    async def scenario():
        texts = []
        for p in PROMPTS:
            _, text, _ = await run_to_end(engine, GenerationRequest(p, GREEDY))
            texts.append(text)
        return texts

    texts = asyncio.run(scenario())
    assert texts == expected
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with engine.tree_lock:
            dirty = dirty_nodes(engine.cache)
        if not dirty:
            break
        time.sleep(0.05)
    assert not dirty, "the idle worker left device-only nodes behind"
    engine.check_integrity()
    assert engine.tiers.cleaned_tokens_total > 0
    # Every device node now has a host copy: the next eviction gives slots back without copying.
    second = asyncio.run(scenario())
    assert second == expected
    engine.check_integrity()


LONG = list(range(1000, 1600))  # 600 tokens: three cleaner pieces
OTHER = list(range(2000, 2600))


def test_a_paused_copy_resumes_or_is_finished_by_eviction_and_a_stale_one_is_given_back():
    from local_engine.cache.tiers.cleaner import CLEAN_CHUNK_TOKENS

    clock = FakeClock()
    cache = tiered_cache(device_tokens=700, host_tokens=1400, clock=clock)
    store(cache, "ns", LONG)
    pieces = iter([False, True])  # one piece, then a request arrives
    assert clean(cache, should_stop=lambda: next(pieces)) == CLEAN_CHUNK_TOKENS
    pending = cache.tiers.pending_clean
    assert pending is not None and pending.node.host_slots is None
    cache.check_integrity()  # the paused copy's host slots are counted
    clock.now += 1
    store(cache, "ns", OTHER)  # evicts LONG: eviction copies only the rest, then frees the device slots
    assert cache.tiers.pending_clean is None
    cache.check_integrity()
    assert cache.tier_stats()["device"]["demoted_tokens_total"] == 600
    assert cache.tiers.cleaned_tokens_total == 600
    match, own = admit(cache, "ns", LONG + [1])
    assert match.tier_tokens == TierTokens(0, 600, 0)
    assert_kv(cache.tiers.device_pool, match.slots, "ns", LONG)
    release(cache, match, own)
    cache.check_integrity()

    # A copy paused on OTHER goes stale when OTHER is split by a shorter match: it is abandoned, then redone whole.
    cache = tiered_cache(device_tokens=700, host_tokens=1400, clock=clock)
    store(cache, "ns", OTHER)
    pieces = iter([False, True])
    assert clean(cache, should_stop=lambda: next(pieces)) == CLEAN_CHUNK_TOKENS
    assert cache.tiers.pending_clean.node.key[0] == OTHER[0]
    match, own = admit(cache, "ns", OTHER[:100] + [7])  # splits OTHER after 100 tokens
    release(cache, match, own)
    cache.check_integrity()
    free_before = cache.tiers.free_tokens(1)
    assert clean(cache) > 0
    assert cache.tiers.pending_clean is None and not dirty_nodes(cache)
    cache.check_integrity()
    # The stale copy's 600 slots came back and the two halves took 600 again (nothing leaked).
    assert cache.tiers.free_tokens(1) == free_before and cache.tiers.cleaned_tokens_total == 600
    match, own = admit(cache, "ns", OTHER + [1])
    assert_kv(cache.tiers.device_pool, match.slots, "ns", OTHER)
    release(cache, match, own)
