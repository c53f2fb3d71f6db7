"""One model of "what would a prefix cache hold": blocks keyed by chained hash, with a capacity, an eviction policy,
an idle TTL and an optional host tier. The what-if simulator (`db.simulation`), the demo's simulated engine
(`gateway.demo.engine_model`) and the rule advisor's approximate path (`gateway.advisor.estimate`) all ask it; the
engine keeps its own radix tree, and a test replays one trace through both to show they agree.

The model (the one vLLM's block hashes and Mooncake's `hash_ids` traces imply; `db.simulation.simulator` documents
its figures):

- Hash i of a chain stands for the whole prefix through block i, so a flat set of blocks is a prefix cache: a lookup
  counts the *leading* blocks found and stops at the first one missing.
- `expire(now)` drops every block idle for more than `ttl_s` (`now - last touch > ttl_s`; a block touched exactly
  `ttl_s` ago stays), in both tiers.
- `admit(chain, now)` caches a request's blocks as an engine does after prefill: all of them, up to the model's total
  capacity (a longer request keeps only its first blocks). They are touched from the deepest to the first, so among
  one request's blocks the deepest counts as the oldest and goes first, as a radix tree frees leaves before parents.
  A request's own admitted blocks are never evicted to make room for it.
- Policies: `lru` evicts the least recently touched block; `fifo` the earliest inserted (a hit does not refresh it).
- Host tier (`host_capacity_blocks`, LRU only): a block evicted from the device (`device_capacity_blocks`) is demoted
  to the host; admitting a host block moves it back to the device; a block evicted from the host is gone. Together
  the two tiers hold what one LRU cache of both sizes would.
- Removed blocks can be remembered (`ghost_capacity`, by hash, most recent kept) as `evicted` or `expired`, so a miss
  can say why.

Capacities are in blocks; None means unlimited. Not thread-safe.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Final

POLICIES: Final = ("lru", "fifo")
DEVICE: Final = "device"
HOST: Final = "host"
EVICTED: Final = "evicted"
EXPIRED: Final = "expired"


class PrefixCacheModel:
    def __init__(
        self,
        device_capacity_blocks: int | None,
        *,
        policy: str = "lru",
        ttl_s: float | None = None,
        host_capacity_blocks: int = 0,
        ghost_capacity: int = 0,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        """Raises ValueError for a negative capacity or TTL, an unknown policy, or a host tier under
        `fifo`. A capacity of 0 holds nothing. `on_drop(block)` is called for every block that leaves the model."""
        if device_capacity_blocks is not None and device_capacity_blocks < 0:
            raise ValueError("device_capacity_blocks cannot be negative (None: unlimited)")
        if host_capacity_blocks < 0:
            raise ValueError("host_capacity_blocks cannot be negative")
        if ttl_s is not None and not ttl_s >= 0:
            raise ValueError("ttl_s cannot be negative (None: no TTL)")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {list(POLICIES)}")
        if host_capacity_blocks and (policy != "lru" or device_capacity_blocks is None):
            raise ValueError("a host tier needs the lru policy and a device capacity")
        self.device_capacity_blocks = device_capacity_blocks
        self.host_capacity_blocks = host_capacity_blocks
        self.policy = policy
        self.ttl_s = ttl_s
        self._ghost_capacity = ghost_capacity
        self._on_drop = on_drop
        self._device: OrderedDict[int, None] = OrderedDict()  # lru: least recently touched first; fifo: first in
        self._host: OrderedDict[int, None] = OrderedDict()  # first demoted (least recently touched) first
        self._touched: OrderedDict[int, float] = OrderedDict()  # with a TTL: block -> last touch, oldest first
        self._ghosts: OrderedDict[int, str] = OrderedDict()  # removed block -> EVICTED / EXPIRED, oldest first
        self.evicted_blocks = 0  # left the model to make room (from the host tier when there is one)
        self.expired_blocks = 0
        self.demoted_blocks = 0

    @property
    def num_blocks(self) -> int:
        return len(self._device) + len(self._host)

    def tier_of(self, block: int) -> str | None:
        """DEVICE, HOST, or None when the model does not hold `block`."""
        if block in self._device:
            return DEVICE
        return HOST if block in self._host else None

    def leading_tiers(self, chain: Sequence[int]) -> list[str]:
        """The tier of each leading cached block of `chain` (a prefix cache stops at the first miss)."""
        tiers = []
        for block in chain:
            tier = self.tier_of(block)
            if tier is None:
                break
            tiers.append(tier)
        return tiers

    def leading_hits(self, chain: Sequence[int]) -> int:
        """How many of `chain`'s blocks, from its first, are cached."""
        hits = 0
        for block in chain:
            if block not in self._device and block not in self._host:
                break
            hits += 1
        return hits

    def removed_as(self, block: int) -> str | None:
        """EVICTED or EXPIRED when `block` was removed lately (and remembered), else None."""
        return self._ghosts.get(block)

    def expire(self, now: float) -> int:
        """Drop the blocks idle for more than `ttl_s` at `now` (seconds); returns how many went."""
        if self.ttl_s is None:
            return 0
        touched, dropped = self._touched, 0
        while touched:
            oldest, last = next(iter(touched.items()))
            if not now - last > self.ttl_s:
                break
            del touched[oldest]
            if oldest in self._device:
                del self._device[oldest]
            else:
                del self._host[oldest]
            self._remove(oldest, EXPIRED)
            dropped += 1
        self.expired_blocks += dropped
        return dropped

    def admit(self, chain: Sequence[int], now: float) -> None:
        """Cache `chain`'s blocks as of `now` (see the module docstring), evicting or demoting others for room."""
        limit = self._total_capacity
        admitted = chain if limit is None or len(chain) <= limit else chain[:limit]
        device, capacity = self._device, self.device_capacity_blocks
        if self.policy == "lru":
            for block in admitted:
                self._host.pop(block, None)  # loaded back to the device below
            for block in reversed(admitted):
                device[block] = None
                device.move_to_end(block)
            if capacity is not None:
                while len(device) > capacity:
                    self._leave_device(device.popitem(last=False)[0])
        else:
            if capacity is not None:
                need = len(device) + sum(1 for block in admitted if block not in device) - capacity
                if need > 0:
                    pinned = set(admitted)
                    victims = []
                    for block in device:
                        if block not in pinned:
                            victims.append(block)
                            if len(victims) == need:
                                break
                    for block in victims:
                        del device[block]
                        self._leave_device(block)
            for block in reversed(admitted):
                if block not in device:
                    device[block] = None
        for block in reversed(admitted):
            if self.ttl_s is not None:
                self._touched[block] = now
                self._touched.move_to_end(block)
            if self._ghosts:
                self._ghosts.pop(block, None)

    @property
    def _total_capacity(self) -> int | None:
        if self.device_capacity_blocks is None:
            return None
        return self.device_capacity_blocks + self.host_capacity_blocks

    def _leave_device(self, block: int) -> None:
        """`block` was evicted from the device: demote it to the host tier, or drop it without one."""
        if not self.host_capacity_blocks:
            self._evict(block)
            return
        self._host[block] = None
        self.demoted_blocks += 1
        while len(self._host) > self.host_capacity_blocks:
            self._evict(self._host.popitem(last=False)[0])

    def _evict(self, block: int) -> None:
        self.evicted_blocks += 1
        if self.ttl_s is not None:
            self._touched.pop(block, None)
        self._remove(block, EVICTED)

    def _remove(self, block: int, kind: str) -> None:
        if self._ghost_capacity:
            self._ghosts[block] = kind
            self._ghosts.move_to_end(block)
            while len(self._ghosts) > self._ghost_capacity:
                self._ghosts.popitem(last=False)
        if self._on_drop is not None:
            self._on_drop(block)


def shared_leading_blocks(chain: Sequence[int], cached: Sequence[int]) -> int:
    """How many leading blocks of `chain` a cache holding exactly `cached`'s blocks would serve."""
    model = PrefixCacheModel(None)
    model.admit(cached, 0.0)
    return model.leading_hits(chain)
