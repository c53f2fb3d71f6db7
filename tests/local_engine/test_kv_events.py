"""The engine's KV events, read by a decoder written only from vLLM's public definitions (`tests/kv_events_reference`):
after every store, eviction, demotion to host and disk, load-back and flush, the blocks the events say each tier
holds (token ids rebuilt through the parent hashes) are exactly the blocks the radix tree holds there."""

from __future__ import annotations

import random
import time

import httpx
import msgspec
import pytest
from msgspec.msgpack import Decoder

from local_engine.kv_events import wire
from local_engine.kv_events.config import KvEventsConfig
from local_engine.kv_events.publisher import KvEventPublisher
from tests.kv_events_reference import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, ReferenceSubscriber

from .tier_fixtures import admit, release, store, tiered_cache

MEDIUM = ("GPU", "CPU", "DISK")
SIZE = 16


def tree_blocks(cache, size: int = SIZE) -> set[tuple[str, tuple[int, ...], str]]:
    """(namespace, tokens from the root to the block's end, medium) of every full block each tier holds, read from
    the tree itself: a block is held in a tier when every node it overlaps has a copy there."""
    held = set()
    for namespace, root in cache.roots().items():
        stack = [(child, [], []) for child in root.children.values()]
        while stack:
            node, path, masks = stack.pop()
            mask = sum(1 << tier for tier in range(3) if node.copy_in(tier) is not None)
            path, masks = path + node.key, masks + [mask] * node.num_tokens
            for i in range(len(path) // size):
                block_mask = 0b111
                for value in masks[i * size : (i + 1) * size]:
                    block_mask &= value
                prefix = tuple(path[: (i + 1) * size])
                held.update((namespace, prefix, MEDIUM[t]) for t in range(3) if block_mask >> t & 1)
            stack.extend((child, path, masks) for child in node.children.values())
    return held


class Mirror:
    """What a subscriber learns from the events: block hash -> (namespace, tokens from the root), held per medium."""

    def __init__(self) -> None:
        self.blocks: dict[int, tuple[str, tuple[int, ...]]] = {}
        self.held: set[tuple[int, str]] = set()
        self.decoder = Decoder(type=KVEventBatch)

    def apply_payload(self, payload: bytes) -> None:
        self.apply(self.decoder.decode(payload))

    def apply(self, batch: KVEventBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockStored):
                if event.parent_block_hash is None:
                    extra = event.extra_keys[0] if event.extra_keys else None
                    namespace, prefix = (extra[0] if extra else ""), ()
                else:
                    namespace, prefix = self.blocks[event.parent_block_hash]
                for i, block_hash in enumerate(event.block_hashes):
                    prefix = prefix + tuple(event.token_ids[i * event.block_size : (i + 1) * event.block_size])
                    assert event.block_size == SIZE
                    self.blocks[block_hash] = (namespace, prefix)
                    self.held.add((block_hash, event.medium))
            elif isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    assert (block_hash, event.medium) in self.held, "removed a block that was not announced"
                    self.held.discard((block_hash, event.medium))
            elif isinstance(event, AllBlocksCleared):
                self.held.clear()

    def state(self) -> set[tuple[str, tuple[int, ...], str]]:
        return {(*self.blocks[block_hash], medium) for block_hash, medium in self.held}


def watched(cache) -> Mirror:
    """Send the cache's events through the wire encoding into a mirror decoded with the reference structs."""
    mirror = Mirror()
    cache.events.attach(lambda events: mirror.apply_payload(
        msgspec.msgpack.encode(wire.KVEventBatch(ts=time.time(), events=events))))
    return mirror


A, B, C = list(range(100, 140)), list(range(200, 240)), list(range(300, 340))


def test_demotion_to_host_and_disk_load_back_and_flush_are_announced_per_medium(tmp_path):
    cache = tiered_cache(device_tokens=64, host_tokens=64, disk_dir=tmp_path, disk_tokens=200)
    mirror = watched(cache)
    steps = [
        lambda: store(cache, "", A),
        lambda: store(cache, "tenant-1", A[:20] + B[:20]),  # another namespace: same first tokens, other blocks
        lambda: store(cache, "", C),  # the device is full: the oldest goes to the host
        lambda: store(cache, "", A[:24] + C[:30]),  # shares A's first 24 tokens: a block crosses the node boundary
        lambda: store(cache, "", list(range(500, 540))),  # host full too: something goes to disk
    ]
    for step in steps:
        step()
        cache.check_integrity()
        assert mirror.state() == tree_blocks(cache)
    assert {medium for *_, medium in mirror.state()} == {"GPU", "CPU", "DISK"}
    match, own = admit(cache, "", A + [1])  # loaded back from wherever A went
    assert match.matched_tokens == 40
    assert mirror.state() == tree_blocks(cache)
    assert ("", tuple(A[:32]), "GPU") in mirror.state()
    release(cache, match, own)
    cache.flush()
    assert mirror.state() == tree_blocks(cache) == set()


@pytest.mark.parametrize("write_policy", ["write_back", "write_through"])
def test_random_traffic_keeps_the_announced_blocks_equal_to_the_tree(tmp_path, write_policy):
    rng = random.Random(7)
    cache = tiered_cache(device_tokens=96, host_tokens=64, disk_dir=tmp_path, disk_tokens=96,
                         write_policy=write_policy)
    mirror = watched(cache)
    stems = [list(range(1000 * s, 1000 * s + 40)) for s in range(4)]
    for _ in range(40):
        stem = rng.choice(stems)
        tokens = stem[: rng.randrange(8, 40)] + [rng.randrange(50_000, 60_000) for _ in range(rng.randrange(0, 30))]
        namespace = rng.choice(["", "t"])
        if rng.random() < 0.3:
            match, own = admit(cache, namespace, tokens + [1])
            release(cache, match, own)
        elif rng.random() < 0.05:
            cache.flush()
        else:
            store(cache, namespace, tokens)
        cache.check_integrity()
        assert mirror.state() == tree_blocks(cache)


def test_a_full_queue_loses_events_counted_and_the_next_batch_is_the_whole_state():
    cache = tiered_cache(device_tokens=256)
    publisher = KvEventPublisher(KvEventsConfig(max_queue_changes=1), cache.events.announced_events)
    cache.events.attach(publisher.enqueue)
    store(cache, "", A)
    store(cache, "", B)  # the queue holds one change: this one is lost
    assert publisher.counters.lost_events_total == 1
    publisher.start()
    try:
        assert _wait(lambda: publisher.since(-1, 10)["batches"])
        mirror = Mirror()
        for batch in publisher.since(-1, 10)["batches"]:  # the HTTP view: the wire's own arrays
            mirror.apply(msgspec.convert(msgspec.json.decode(msgspec.json.encode([batch["ts"], batch["events"]])),
                                         KVEventBatch))
        assert mirror.state() == tree_blocks(cache)
        assert publisher.counters.reannouncements_total == 1
    finally:
        publisher.close()


def _wait(condition, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    return None


def test_a_serving_engine_publishes_over_zeromq_and_replays_from_any_held_sequence(tiny_loaded, tmp_path):
    from tests.local_engine.server_fixtures import served_engine

    config = KvEventsConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic="kv")
    with served_engine(tiny_loaded, admin_token="admin", kv_cache_tokens=160, host_cache_tokens=96,
                       disk_cache_dir=str(tmp_path / "kv"), kv_events=config) as (url, engine):
        publisher = engine.kv_events
        live = ReferenceSubscriber(publisher.bound_endpoint, publisher.bound_replay_endpoint, topic="kv")
        try:
            assert live.replay_from(0) >= 1  # the first batch: the (empty) state
            for i in range(6):  # about 60 tokens each into a 160-token pool: demotions to host, then disk
                body = {"model": "tiny-llama", "max_tokens": 2,
                        "messages": [{"role": "user", "content": f"prompt {i} " + "word " * 40}]}
                assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 200
            live.drain()
            mirror = Mirror()
            for _, batch in live.batches:
                mirror.apply(batch)
            with engine.tree_lock:
                truth = tree_blocks(engine.cache)
            assert mirror.state() == truth
            assert {medium for *_, medium in truth} >= {"GPU", "CPU"}
            # A late subscriber gets the same from a replay that starts anywhere still held.
            late = ReferenceSubscriber(publisher.bound_endpoint, publisher.bound_replay_endpoint, topic="kv")
            try:
                assert late.replay_from(0) == len(live.batches)
                assert [seq for seq, _ in late.batches] == list(range(len(live.batches)))
            finally:
                late.close()
            assert httpx.post(f"{url}/v1/cache/flush", headers={"authorization": "Bearer admin"}).status_code == 200
            live.drain()
            mirror = Mirror()
            for _, batch in live.batches:
                mirror.apply(batch)
            assert mirror.state() == set()
            assert isinstance(live.batches[-1][1].events[-1], AllBlocksCleared)
            view = httpx.get(f"{url}/v1/cache/events", params={"after": len(live.batches) - 2}).json()
            assert [b["seq"] for b in view["batches"]] == [len(live.batches) - 1] and view["gap"] is False
            assert httpx.get(f"{url}/v1/cache").json()["kv_events"]["endpoint"] == publisher.bound_endpoint
            metrics = httpx.get(f"{url}/metrics").text
            assert f"prefixscope_engine_kv_event_batches_total {float(len(live.batches))}" in metrics
            assert "prefixscope_engine_kv_events_lost_total 0.0" in metrics
        finally:
            live.close()
