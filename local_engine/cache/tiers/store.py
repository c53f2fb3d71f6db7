"""Where a node's KV bytes live below the tree: the device pool (L1), the host pool (L2) and the disk tier (L3).

TierStore moves bytes and hands out space; it never decides what to move (RadixCache and tier_eviction do). Copies
are read as `[num_layers, n, num_kv_heads, head_dim]` tensors and written into the target tier's own storage, so a
move between any two tiers is `put(target, read(source))`. On CUDA the host pool is pinned, so copies to and from
the device are plain DMA transfers.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

import torch

from local_engine.cache.tiers.disk_index import DiskTier
from local_engine.cache.kv_pool import KVPool, copy_slots
from local_engine.cache.radix_node import RadixNode
from local_engine.cache.retention import Lifetime
from local_engine.cache.slot_allocator import SlotAllocator

log = logging.getLogger(__name__)

DEVICE, HOST, DISK = 0, 1, 2
TIER_NAMES = ("device", "host", "disk")
WRITE_POLICIES = ("write_back", "write_through")


@dataclass
class TierCounters:
    """Per tier, since start (tokens, counts, ms)."""

    hit_tokens_total: int = 0
    loads_total: int = 0
    load_tokens_total: int = 0
    load_ms_total: float = 0.0
    demoted_tokens_total: int = 0
    dropped_tokens_total: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class TierStore:
    """`device_pool` may be None when nothing is ever loaded or written down (a cache without lower tiers)."""

    device_pool: KVPool | None = None
    device_allocator: SlotAllocator | None = None
    host_pool: KVPool | None = None
    host_allocator: SlotAllocator | None = None
    disk: DiskTier | None = None
    write_policy: str = "write_back"
    counters: tuple[TierCounters, ...] = field(default_factory=lambda: (TierCounters(), TierCounters(), TierCounters()))
    cleaned_tokens_total: int = 0  # device tokens the idle cleaner gave a host copy ahead of their eviction
    pending_clean: object | None = None  # tier_cleaner.PendingCopy: a host copy under way, its slots held here

    def __post_init__(self) -> None:
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(f"unknown cache write policy {self.write_policy!r}; choose one of {list(WRITE_POLICIES)}")
        if (self.host_pool is not None or self.disk is not None) and self.device_pool is None:
            raise ValueError("lower cache tiers need the device pool to move KV to and from")

    @property
    def has_lower_tiers(self) -> bool:
        return self.host_pool is not None or self.disk is not None

    @property
    def write_through(self) -> bool:
        return self.write_policy == "write_through"

    def enabled(self, tier: int) -> bool:
        return (True, self.host_pool is not None, self.disk is not None)[tier]

    def lower_tiers(self, tier: int) -> list[int]:
        """The enabled tiers slower than `tier`, nearest first."""
        return [t for t in range(tier + 1, 3) if self.enabled(t)]

    def capacity_tokens(self, tier: int) -> int:
        if tier == HOST:
            return self.host_allocator.num_slots if self.host_allocator else 0
        if tier == DISK:
            return self.disk.capacity_tokens if self.disk else 0
        return self.device_allocator.num_slots if self.device_allocator else 0

    def free_tokens(self, tier: int) -> int:
        if tier == HOST:
            return self.host_allocator.num_free if self.host_allocator else 0
        if tier == DISK:
            return self.disk.free_tokens if self.disk else 0
        return self.device_allocator.num_free if self.device_allocator else 0

    def capacity_bytes(self, tier: int) -> int:
        if tier == HOST:
            return self.host_pool.num_bytes if self.host_pool else 0
        if tier == DISK:
            return self.disk.capacity_bytes if self.disk else 0
        return self.device_pool.num_bytes if self.device_pool else 0

    # ---- bytes --------------------------------------------------------------------------------------------------

    def read(self, node: RadixNode, tier: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of `node`'s copy in `tier`: `[num_layers, n, num_kv_heads, head_dim]` each. Raises CorruptKVFile for a
        disk copy that fails its checks."""
        if tier == DEVICE:
            return self.device_pool.read_all_layers(node.slots)
        if tier == HOST:
            return self.host_pool.read_all_layers(node.host_slots)
        return self.disk.read(node.disk)

    def put(self, node: RadixNode, tier: int, k: torch.Tensor, v: torch.Tensor, namespace: str) -> bool:
        """Give `node` a copy in host or disk from `k, v`; False when that tier has no free space (the caller makes
        room first) or the disk write fails."""
        if tier == HOST:
            slots = self.host_allocator.alloc(node.num_tokens)
            if slots is None:
                return False
            _write(self.host_pool, slots, k, v)
            node.host_slots = slots
            return True
        if self.disk.free_tokens < node.num_tokens:
            return False
        path = node.path_token_ids()
        label = Lifetime(node.ttl_s, node.persistent).label
        retention = {"retention": label, "ttl_s": node.ttl_s, "persistent": node.persistent}
        try:
            node.disk = self.disk.write(namespace, path, len(path) - node.num_tokens, k, v, retention)
        except OSError as error:
            log.warning("disk KV cache: could not write to %s (%s); the prefix is not kept on disk", self.disk.directory,
                        error)
            return False
        return True

    def copy_device_to_host(self, device_slots: torch.Tensor, host_slots: torch.Tensor) -> None:
        """Copy the KV of `device_slots` into `host_slots` (int64 `[n]` each), pool to pool; waited for on CUDA."""
        _copy_between(self.device_pool, device_slots, self.host_pool, host_slots)

    def copy_to(self, node: RadixNode, source: int, target: int, namespace: str) -> bool:
        """Give `node` a copy in the slower `target` from its copy in `source` (`put`'s result). Device to host goes
        pool to pool without a temporary tensor; anything else through `read`."""
        if source == DEVICE and target == HOST:
            slots = self.host_allocator.alloc(node.num_tokens)
            if slots is None:
                return False
            self.copy_device_to_host(node.slots, slots)
            node.host_slots = slots
            return True
        k, v = self.read(node, source)
        return self.put(node, target, k, v, namespace)

    def load_host_into_device(self, node: RadixNode, slots: torch.Tensor) -> None:
        """Copy `node`'s host copy into device `slots` (int64 `[node.num_tokens]`), pool to pool. On CUDA the copy is
        asynchronous: the caller synchronizes before the host slots can be reused (load_back does)."""
        _copy_between(self.host_pool, node.host_slots, self.device_pool, slots)

    def load_into_device(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Write `k, v` into device pool `slots` (int64 `[n]`)."""
        _write(self.device_pool, slots, k, v)

    def free_copy(self, node: RadixNode, tier: int) -> None:
        """Give back `node`'s copy in `tier` (slots to the allocator, the extent's file reference to the disk tier)."""
        if tier == DEVICE:
            self.device_allocator.free(node.slots)
            node.slots = None
        elif tier == HOST:
            self.host_allocator.free(node.host_slots)
            node.host_slots = None
        else:
            self.disk.release(node.disk)
            node.disk = None

    def split_copies(self, upper: RadixNode, lower: RadixNode, num_tokens: int) -> None:
        """`lower` held the copies of `upper.key + lower.key`; cut them after `num_tokens`."""
        if lower.host_slots is not None:
            upper.host_slots, lower.host_slots = lower.host_slots[:num_tokens], lower.host_slots[num_tokens:]
        if lower.disk is not None:
            first, rest = lower.disk.split(num_tokens)
            # One extent became two of the same file: one more reference, no more tokens.
            first.file.refs += 1
            upper.disk, lower.disk = first, rest


def _copy_between(source: KVPool, source_slots: torch.Tensor, target: KVPool, target_slots: torch.Tensor) -> None:
    """Pool to pool (see `_write` for the CUDA ordering: a copy down to the host is waited for here)."""
    cross_cuda = source.k.device != target.k.device and "cuda" in (source.k.device.type, target.k.device.type)
    copy_slots(source, source_slots, target, target_slots, non_blocking=cross_cuda)
    if cross_cuda and target.k.device.type == "cpu":
        torch.cuda.synchronize(source.k.device)


def _write(pool: KVPool, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Copy `k, v` into `pool`'s `slots`, straight from wherever they are (no staging copy on the target device).

    Between a CUDA device and the (pinned) host pool the copy is asynchronous; a copy down to the host is waited for
    here, since the host reads those bytes (a disk write, a later load) without the stream's ordering. A copy up to
    the device is ordered before every later kernel by the stream; load_back waits for it before timing the load and
    before the host slots it read can be reused."""
    target, source = pool.k.device, k.device
    cross_cuda = target != source and "cuda" in (target.type, source.type)
    pool.write_all_layers(slots, k, v, non_blocking=cross_cuda)
    if cross_cuda and target.type == "cpu":
        torch.cuda.synchronize(source)
