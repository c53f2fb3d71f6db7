"""Random operation sequences against RadixCache, checked against a plain model of "which prefixes are cached".

The reference keeps every cached page-aligned prefix as a tuple, with its last access time and lock count. After
every step the tree must agree with it on the longest cached prefix, and `check_integrity()` must hold.
"""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from local_engine.cache import MissKind, RadixCache, RadixCacheConfig, SlotAllocator

NAMESPACES = ("tenant-a", "tenant-b")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RadixCacheMachine(RuleBasedStateMachine):
    page_size = 1
    capacity = 48
    max_len = 24

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.allocator = SlotAllocator(self.capacity)
        self.ttl_s = 50.0
        self.cache = RadixCache(
            RadixCacheConfig(page_size=self.page_size, ttl_s=self.ttl_s), self.allocator, clock=self.clock
        )
        self.cached: dict[str, dict[tuple[int, ...], float]] = {ns: {} for ns in NAMESPACES}
        self.locks: dict[str, Counter] = {ns: Counter() for ns in NAMESPACES}
        self.ghosts: dict[tuple[str, tuple[int, ...]], MissKind] = {}
        self.held: list[tuple[str, tuple[int, ...], object]] = []

    @initialize()
    def start(self) -> None:
        self.cache.check_integrity()

    def sequences(self):
        # A small alphabet makes shared prefixes (and therefore splits) common.
        return st.lists(st.integers(0, 2), min_size=1, max_size=self.max_len)

    # ---- reference helpers ---------------------------------------------------------------------------------------

    def aligned_prefixes(self, tokens: tuple[int, ...], upto: int, start: int = 0):
        first = start - start % self.page_size + self.page_size
        return [tokens[:length] for length in range(first, upto + 1, self.page_size)]

    def expected_match(self, namespace: str, tokens: tuple[int, ...]) -> int:
        limit = max(0, len(tokens) - 1)
        limit -= limit % self.page_size
        matched = 0
        for prefix in self.aligned_prefixes(tokens, limit):
            if prefix not in self.cached[namespace]:
                break
            matched = len(prefix)
        return matched

    def expected_kind(self, namespace: str, tokens: tuple[int, ...], matched: int) -> MissKind:
        limit = max(0, len(tokens) - 1)
        limit -= limit % self.page_size
        if limit == 0:
            return MissKind.COLD
        if matched >= limit:
            return MissKind.HIT
        ghost = self.ghosts.get((namespace, tokens[: matched + self.page_size]))
        if ghost is not None:
            return ghost
        return MissKind.PARTIAL if matched else MissKind.COLD

    def touch(self, namespace: str, tokens: tuple[int, ...], upto: int) -> None:
        for prefix in self.aligned_prefixes(tokens, upto):
            self.cached[namespace][prefix] = self.clock.now

    def apply_removals(self, removed) -> None:
        for prefix in removed:
            path = prefix.token_ids
            namespace = prefix.namespace
            start = len(path) - prefix.num_tokens
            assert prefix.num_tokens > 0 and start % self.page_size == 0
            assert not any(
                len(other) > len(path) and other[: len(path)] == path for other in self.cached[namespace]
            ), "removed a prefix that still had cached continuations (not a leaf)"
            for gone in self.aligned_prefixes(path, len(path), start):
                assert gone in self.cached[namespace], "removed a prefix that was not cached"
                assert self.locks[namespace][gone] == 0, "removed a locked prefix"
                if prefix.expired:
                    assert self.cached[namespace][gone] <= self.clock.now - self.ttl_s, "expired a fresh prefix"
                del self.cached[namespace][gone]
            kind = MissKind.EXPIRED if prefix.expired else MissKind.EVICTED
            self.ghosts[(namespace, path[: start + self.page_size])] = kind

    # ---- operations ----------------------------------------------------------------------------------------------

    @rule(namespace=st.sampled_from(NAMESPACES), data=st.data(), lock=st.booleans())
    def match(self, namespace: str, data, lock: bool) -> None:
        tokens = tuple(data.draw(self.sequences()))
        self.apply_removals(self.cache.expire())
        result = self.cache.match(namespace, list(tokens))
        expected = self.expected_match(namespace, tokens)
        assert result.matched_tokens == expected
        assert result.slots.numel() == expected
        assert result.miss_kind == self.expected_kind(namespace, tokens, expected)
        self.touch(namespace, tokens, expected)
        if lock and expected:
            self.cache.lock(result.node)
            for prefix in self.aligned_prefixes(tokens, expected):
                self.locks[namespace][prefix] += 1
            self.held.append((namespace, tokens[:expected], result.node))

    @rule(namespace=st.sampled_from(NAMESPACES), data=st.data())
    def dry_run_match(self, namespace: str, data) -> None:
        tokens = tuple(data.draw(self.sequences()))
        before = self.cache.snapshot(max_nodes=10_000)
        result = self.cache.match(namespace, list(tokens), dry_run=True)
        assert result.matched_tokens == self.expected_match(namespace, tokens)
        assert result.node is None
        assert self.cache.snapshot(max_nodes=10_000) == before

    @rule(namespace=st.sampled_from(NAMESPACES), data=st.data())
    def insert(self, namespace: str, data) -> None:
        tokens = tuple(data.draw(self.sequences()))
        slots = self.allocator.alloc(len(tokens))
        if slots is None:
            self.apply_removals(self.cache.evict(len(tokens) - self.allocator.num_free))
            slots = self.allocator.alloc(len(tokens))
        if slots is None:
            return
        result = self.cache.insert(namespace, list(tokens), slots)
        stored = len(tokens) - len(tokens) % self.page_size
        assert result.num_stored_tokens == stored
        # The sentinel token lifts the "all but the last token" limit: insert may reuse the whole sequence.
        assert result.num_cached_tokens == self.expected_match(namespace, tokens + (-1,))
        self.allocator.free(slots[: result.num_cached_tokens])
        self.allocator.free(slots[result.num_stored_tokens :])
        self.touch(namespace, tokens, stored)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def unlock(self, data) -> None:
        index = data.draw(st.integers(0, len(self.held) - 1))
        namespace, prefix_tokens, node = self.held.pop(index)
        self.cache.unlock(node)
        for prefix in self.aligned_prefixes(prefix_tokens, len(prefix_tokens)):
            self.locks[namespace][prefix] -= 1

    @rule(num_tokens=st.integers(1, 64))
    def evict(self, num_tokens: int) -> None:
        evictable_before = self.cache.evictable_tokens
        removed = self.cache.evict(num_tokens)
        self.apply_removals(removed)
        freed = sum(prefix.num_tokens for prefix in removed)
        assert freed >= min(num_tokens, evictable_before) or self.cache.evictable_tokens == 0

    @rule(seconds=st.floats(0, 80))
    def advance_clock_and_expire(self, seconds: float) -> None:
        self.clock.now += seconds
        self.apply_removals(self.cache.expire())
        deadline = self.clock.now - self.ttl_s
        for namespace in NAMESPACES:
            for prefix, last_access in self.cached[namespace].items():
                assert self.locks[namespace][prefix] > 0 or last_access > deadline, "a stale prefix survived expiry"

    @invariant()
    def integrity(self) -> None:
        self.cache.check_integrity()
        assert self.cache.cached_tokens == sum(len(c) for c in self.cached.values()) * self.page_size


class PagedRadixCacheMachine(RadixCacheMachine):
    page_size = 16
    capacity = 256
    max_len = 70

    def sequences(self):
        # Runs of a repeated token keep page-sized pieces equal often enough for shared pages.
        runs = st.lists(st.tuples(st.integers(0, 1), st.sampled_from([8, 16, 24])), min_size=1, max_size=5)
        return runs.map(lambda pieces: [token for token, count in pieces for _ in range(count)][: self.max_len])


_settings = settings(max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("machine", [RadixCacheMachine, PagedRadixCacheMachine], ids=["page1", "page16"])
def test_random_operations_agree_with_reference(machine) -> None:
    machine.TestCase.settings = _settings
    machine.TestCase().runTest()


# ---- tiers: demote, load back, restart, corruption ---------------------------------------------------------------

RETENTIONS = (None, "5m", "1h", "persistent")


class TieredRadixCacheMachine(RuleBasedStateMachine):
    """Random operations on a cache with a device pool, a host pool and a disk directory, all small. The KV written
    for each token encodes its namespace and path, so whatever a match loads back (from any tier, across restarts)
    must be exactly the KV of the matched tokens; a corrupted file must never be served. Integrity is checked per
    tier after every step."""

    device_tokens, host_tokens, disk_tokens = 24, 16, 40
    write_policy = "write_back"

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.directory = tempfile.mkdtemp(prefix="tiers-")
        self.clock = FakeClock()
        self.cache = self._new_cache()
        self.inserted: dict[str, set[tuple[int, ...]]] = {ns: set() for ns in NAMESPACES}
        self.held: list[tuple[object, object]] = []

    def _new_cache(self):
        from .tier_fixtures import tiered_cache

        return tiered_cache(self.device_tokens, self.host_tokens, self.directory, self.disk_tokens, clock=self.clock,
                            write_policy=self.write_policy)

    def teardown(self) -> None:
        import shutil

        self.cache.tiers.disk.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def sequences(self):
        return st.lists(st.integers(0, 2), min_size=1, max_size=12)

    @rule(namespace=st.sampled_from(NAMESPACES), data=st.data(), retention=st.sampled_from(RETENTIONS))
    def insert(self, namespace: str, data, retention) -> None:
        from .tier_fixtures import fill_kv

        tokens = list(data.draw(self.sequences()))
        slots = self.cache.allocator.alloc(len(tokens))
        if slots is None:
            self.cache.evict(len(tokens) - self.cache.allocator.num_free)
            slots = self.cache.allocator.alloc(len(tokens))
        if slots is None:
            return
        fill_kv(self.cache.tiers.device_pool, slots, namespace, tokens)
        result = self.cache.insert(namespace, tokens, slots, retention=retention)
        self.cache.allocator.free(slots[: result.num_cached_tokens])
        self.cache.allocator.free(slots[result.num_stored_tokens :])
        self.inserted[namespace].update(tuple(tokens[:n]) for n in range(1, len(tokens) + 1))

    @rule(namespace=st.sampled_from(NAMESPACES), data=st.data(), keep=st.booleans(),
          retention=st.sampled_from(RETENTIONS))
    def admit_and_load_back(self, namespace: str, data, keep: bool, retention) -> None:
        from local_engine.cache.tiers.loading import load_back

        from .tier_fixtures import assert_kv

        tokens = list(data.draw(self.sequences()))
        match = self.cache.match(namespace, tokens, retention=retention)
        assert match.tier_tokens.total == match.matched_tokens
        assert match.matched_tokens == 0 or tuple(tokens[: match.matched_tokens]) in self.inserted[namespace]
        self.cache.lock(match.node)
        num_device = match.tier_tokens.device
        needed = len(tokens) - num_device
        slots = self.cache.allocator.alloc(needed)
        if slots is None:
            self.cache.evict(needed - self.cache.allocator.num_free)
            slots = self.cache.allocator.alloc(needed)
        if slots is None:
            self.cache.unlock(match.node)
            return
        if num_device < match.matched_tokens:
            served = load_back(self.cache, namespace, tokens, match, slots)
            assert served.matched_tokens <= match.matched_tokens
            assert served.tier_tokens.total == served.matched_tokens
            match = served
        assert match.slots.numel() == match.matched_tokens
        assert_kv(self.cache.tiers.device_pool, match.slots, namespace, tokens)
        own = slots[match.matched_tokens - num_device :]
        if keep:
            self.held.append((match.node, own))
        else:
            self.cache.unlock(match.node)
            self.cache.allocator.free(own)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def finish(self, data) -> None:
        node, own = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.cache.unlock(node)
        self.cache.allocator.free(own)

    @rule(tier=st.sampled_from([0, 1, 2]), num_tokens=st.integers(1, 30))
    def evict_from_tier(self, tier: int, num_tokens: int) -> None:
        from local_engine.cache.tiers.eviction import make_room

        evictable_before = self.cache.evictable[tier]
        free_before = self.cache.tiers.free_tokens(tier)
        make_room(self.cache, tier, num_tokens)
        freed = self.cache.tiers.free_tokens(tier) - free_before
        assert freed >= min(num_tokens, evictable_before) or self.cache.evictable[tier] == 0

    @rule(max_tokens=st.integers(1, 20), chunk_tokens=st.integers(1, 4), pieces=st.integers(0, 4))
    def clean_while_idle(self, max_tokens: int, chunk_tokens: int, pieces: int) -> None:
        """The write-back cleaner, paused after `pieces` pieces (a request arrived) or by its token bound."""
        from local_engine.cache.tiers.cleaner import clean

        left = iter(range(pieces, -1, -1))
        demoted_before = self.cache.tiers.counters[0].demoted_tokens_total
        clean(self.cache, max_tokens=max_tokens, should_stop=lambda: next(left, 0) == 0, chunk_tokens=chunk_tokens)
        assert self.cache.tiers.counters[0].demoted_tokens_total == demoted_before  # nothing left the device

    @rule(seconds=st.sampled_from([10.0, 400.0, 4000.0]))
    def advance_clock_and_expire(self, seconds: float) -> None:
        self.clock.now += seconds
        self.cache.expire()

    @rule(data=st.data())
    def corrupt_a_file(self, data) -> None:
        import os

        names = sorted(name for name in os.listdir(self.directory) if name.endswith(".kv"))
        if not names:
            return
        path = os.path.join(self.directory, data.draw(st.sampled_from(names)))
        with open(path, "r+b") as target:
            target.seek(-1, os.SEEK_END)
            last = target.read(1)
            target.seek(-1, os.SEEK_END)
            target.write(bytes([last[0] ^ 0x5A]))

    @rule()
    def restart(self) -> None:
        from local_engine.cache.tiers.persistence import persist_to_disk, rebuild_from_disk

        for node, own in self.held:
            self.cache.unlock(node)
            self.cache.allocator.free(own)
        self.held.clear()
        persist_to_disk(self.cache)
        self.cache.check_integrity()
        self.cache.tiers.disk.close()
        self.cache = self._new_cache()
        rebuild_from_disk(self.cache)

    @invariant()
    def integrity(self) -> None:
        self.cache.check_integrity(num_slots_outside_tree=sum(own.numel() for _, own in self.held))


class WriteThroughTieredMachine(TieredRadixCacheMachine):
    write_policy = "write_through"


@pytest.mark.parametrize("machine", [TieredRadixCacheMachine, WriteThroughTieredMachine],
                         ids=["write_back", "write_through"])
def test_tiered_random_operations_keep_every_tier_consistent(machine) -> None:
    machine.TestCase.settings = settings(
        max_examples=40, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
    )
    machine.TestCase().runTest()
