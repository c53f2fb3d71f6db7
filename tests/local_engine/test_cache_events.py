"""Cache events: the block hashes the radix cache publishes on insert, eviction, expiry and flush, checked against
the engine's own hash chains; the cursor window, gaps and snapshots."""

from __future__ import annotations

from local_engine.cache.events import CacheEventLog
from local_engine.cache.hash_chain import page_hash_chain
from tests.local_engine.test_radix_cache import make_cache, store


def chain(namespace, tokens, size=16):
    return page_hash_chain(namespace, list(tokens), size)


def test_insert_publishes_exactly_the_newly_held_blocks():
    cache, allocator, _ = make_cache(capacity=256)
    store(cache, allocator, "t1", range(40))  # blocks 0 and 1 (the last 8 tokens make no full block)
    store(cache, allocator, "t1", range(50))  # block 2 (32..48) is new; 0 and 1 were held
    events = cache.events.since(0, 100)["events"]
    assert [(e["seq"], e["kind"], e["namespace"]) for e in events] == [(1, "stored", "t1"), (2, "stored", "t1")]
    assert events[0]["block_hashes"] == chain("t1", range(40))
    assert events[1]["block_hashes"] == chain("t1", range(50))[2:]
    assert cache.events.snapshot()["namespaces"] == {"t1": sorted(chain("t1", range(50)))}


def test_same_tokens_in_two_namespaces_are_different_blocks():
    cache, allocator, _ = make_cache(capacity=256)
    store(cache, allocator, "tenant-a", range(32))
    store(cache, allocator, "tenant-b", range(32))
    held = cache.events.snapshot()["namespaces"]
    assert set(held) == {"tenant-a", "tenant-b"}
    assert not set(held["tenant-a"]) & set(held["tenant-b"])


def test_eviction_publishes_the_blocks_that_lost_a_token():
    cache, allocator, clock = make_cache(capacity=64)
    store(cache, allocator, "n", range(32))
    clock.now = 1.0
    store(cache, allocator, "n", [*range(20), *range(100, 112)])  # shares 20 tokens, then diverges: 2 blocks
    after = cache.events.since(0, 100)["last_seq"]
    clock.now = 2.0
    store(cache, allocator, "n", range(200, 232))  # needs 32 slots: evicts the LRU leaf (tokens 20..32 of range(32))
    events = cache.events.since(after, 100)["events"]
    removed = [e for e in events if e["kind"] == "removed"]
    block_1 = chain("n", range(32))[1]
    assert removed == [{"seq": after + 1, "kind": "removed", "namespace": "n", "block_hashes": [block_1]}]
    held = set(cache.events.snapshot()["namespaces"]["n"])
    expected = {chain("n", range(32))[0], *chain("n", [*range(20), *range(100, 112)]), *chain("n", range(200, 232))}
    assert held == expected


def test_flush_that_empties_the_tree_publishes_cleared():
    cache, allocator, _ = make_cache(capacity=64)
    store(cache, allocator, "n", range(32))
    cache.flush()
    kinds = [e["kind"] for e in cache.events.since(0, 100)["events"]]
    assert kinds == ["stored", "removed", "cleared"]
    assert cache.events.snapshot()["namespaces"] == {}


def test_a_cursor_older_than_the_window_is_a_gap():
    log = CacheEventLog(block_size=4, capacity=3)
    for start in range(0, 20, 4):
        log.stored("n", list(range(start + 4)), start)  # one new block each: seq 1..5
    assert log.since(0, 10)["gap"] is True
    assert log.since(1, 10)["gap"] is True  # seq 2 is gone
    window = log.since(2, 10)
    assert window["gap"] is False and [e["seq"] for e in window["events"]] == [3, 4, 5]
    assert log.since(5, 10) == {**window, "events": []}
    assert log.since(9, 10)["gap"] is True  # ahead of this log: a cursor from another epoch
    snapshot = log.snapshot()
    assert snapshot["seq"] == 5 and snapshot["namespaces"] == {"n": sorted(chain("n", range(20), 4))}
