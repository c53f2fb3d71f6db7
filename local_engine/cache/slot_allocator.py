"""SlotAllocator: the free list of KV pool slot ids, and nothing else."""

from __future__ import annotations

import torch


class SlotAllocator:
    """Hands out and takes back slot ids in `[0, num_slots)`.

    Slot ids live on the CPU as int64 tensors; the pool moves them to its device when it indexes.
    """

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = torch.arange(num_slots, dtype=torch.int64)

    @property
    def num_free(self) -> int:
        return int(self._free.numel())

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """`num_tokens` slot ids (int64 `[num_tokens]`), or None when fewer are free (the caller evicts, then retries)."""
        if num_tokens > self.num_free:
            return None
        slots, self._free = self._free[:num_tokens], self._free[num_tokens:]
        return slots

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel():
            self._free = torch.cat([self._free, slots.to(device="cpu", dtype=torch.int64)])

    def free_slot_ids(self) -> torch.Tensor:
        """A copy of the free list, for integrity checks."""
        return self._free.clone()

    def reset(self) -> None:
        self._free = torch.arange(self.num_slots, dtype=torch.int64)
