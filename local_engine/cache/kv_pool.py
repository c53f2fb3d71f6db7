"""KVPool: the preallocated K/V bytes of every cached token. It knows nothing about prompts or trees."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from local_engine.cache.slot_runs import MAX_RUNS, joint_runs, slot_runs


@dataclass(frozen=True)
class KVPoolConfig:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @property
    def bytes_per_token(self) -> int:
        element_size = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element_size

    def num_slots_for_gib(self, gib: float) -> int:
        return max(1, int(gib * (1 << 30)) // self.bytes_per_token)


class KVPool:
    """Two tensors `k, v` of shape `[num_layers, num_slots, num_kv_heads, head_dim]`, allocated once at start-up.

    A slot holds the keys and values of one token in every layer. Slot ids come from a SlotAllocator; the pool does
    not track which slots are in use.
    """

    def __init__(self, config: KVPoolConfig, num_slots: int, *, pin_memory: bool = False) -> None:
        """`pin_memory`: page-lock a CPU pool (the host tier of a CUDA engine) so device copies are DMA transfers."""
        if num_slots <= 0:
            raise ValueError("the KV pool needs at least one slot")
        self.config = config
        self.num_slots = num_slots
        shape = (config.num_layers, num_slots, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, dtype=config.dtype, device=config.device, pin_memory=pin_memory)
        self.v = torch.zeros(shape, dtype=config.dtype, device=config.device, pin_memory=pin_memory)

    @property
    def num_bytes(self) -> int:
        return self.num_slots * self.config.bytes_per_token

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `slots` (int64 `[n]`) in one layer: two tensors `[n, num_kv_heads, head_dim]`."""
        index = slots.to(self.k.device)
        return self.k[layer].index_select(0, index), self.v[layer].index_select(0, index)

    def read_all_layers(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `slots` in every layer at once: two tensors `[num_layers, n, num_kv_heads, head_dim]`.

        One run of consecutive slots comes back as views of the pool (no copy): they hold these bytes until the
        slots are written again, which the caller's own copy-then-free order guarantees. A few runs are one
        concatenation; scattered slots one gather."""
        runs = slot_runs(slots)
        if runs is not None and len(runs) == 1:
            _, first, length = runs[0]
            return self.k.narrow(1, first, length), self.v.narrow(1, first, length)
        if runs:
            return (torch.cat([self.k.narrow(1, first, length) for _, first, length in runs], dim=1),
                    torch.cat([self.v.narrow(1, first, length) for _, first, length in runs], dim=1))
        index = slots.to(self.k.device)
        return self.k.index_select(1, index), self.v.index_select(1, index)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store `k, v` (`[n, num_kv_heads, head_dim]`) of one layer into `slots` (int64 `[n]`)."""
        index = slots.to(self.k.device)
        self.k[layer].index_copy_(0, index, k.to(self.k.dtype))
        self.v[layer].index_copy_(0, index, v.to(self.v.dtype))

    def write_all_layers(
        self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, non_blocking: bool = False
    ) -> None:
        """Store `k, v` (`[num_layers, n, num_kv_heads, head_dim]`, any device) into `slots` (int64 `[n]`) in every
        layer: one `narrow().copy_()` per run of consecutive slots, a scatter for scattered slots.

        `non_blocking`: let a copy between pinned host memory and a CUDA device run asynchronously; the caller then
        synchronizes before the destination is read on the host or the source is reused (see TierStore)."""
        runs = slot_runs(slots)
        if runs is None:
            index = slots.to(self.k.device)
            self.k.index_copy_(1, index, k.to(self.k.device, self.k.dtype))
            self.v.index_copy_(1, index, v.to(self.v.device, self.v.dtype))
            return
        for offset, first, length in runs:
            self.k.narrow(1, first, length).copy_(k.narrow(1, offset, length), non_blocking=non_blocking)
            self.v.narrow(1, first, length).copy_(v.narrow(1, offset, length), non_blocking=non_blocking)


def copy_slots(
    source: KVPool, source_slots: torch.Tensor, target: KVPool, target_slots: torch.Tensor, *,
    non_blocking: bool = False,
) -> None:
    """Copy the KV of `source_slots` in `source` into `target_slots` in `target` (int64 `[n]` each), every layer,
    with no intermediate tensor: one `narrow().copy_()` per piece that is a run on both sides. Scattered slots fall
    back to a gather and a scatter.

    A 100 MB temporary is not free on CPU: a fresh allocation that size is new pages, faulted in one by one, which
    cost more than the copy itself."""
    source_runs, target_runs = slot_runs(source_slots), slot_runs(target_slots)
    pieces = None
    if source_runs is not None and target_runs is not None:
        pieces = joint_runs(source_runs, target_runs)
    if pieces is None or len(pieces) > MAX_RUNS:
        k, v = source.read_all_layers(source_slots)
        target.write_all_layers(target_slots, k, v, non_blocking=non_blocking)
        return
    for source_first, target_first, length in pieces:
        target.k.narrow(1, target_first, length).copy_(source.k.narrow(1, source_first, length),
                                                       non_blocking=non_blocking)
        target.v.narrow(1, target_first, length).copy_(source.v.narrow(1, source_first, length),
                                                       non_blocking=non_blocking)
