"""One block of memory on transparent huge pages for the weights a CPU decode step reads.

A decode step at small batch sizes streams every weight once, and on 4 KiB pages a 270 MB model crosses some 66,000
of them per step: on the 2-core EPYC of local_engine.model.cpu_kernels (a VM, where a TLB miss walks two page tables),
30 layers of SmolLM2's bf16 matmuls at one row took 5.4-5.9 ms from 2 MiB pages against 7.2-7.4 ms from 4 KiB pages
(best of 20, interleaved). Linux gives an anonymous private mapping huge pages when it is advised so
(`madvise(MADV_HUGEPAGE)`, honoured where /sys/kernel/mm/transparent_hugepage/enabled is `always` or `madvise`)
before its pages are first touched; elsewhere the block is plain memory and nothing else changes.
"""

from __future__ import annotations

import mmap

import torch

_ALIGN = 64  # bytes: every tensor starts on a cache line


class WeightArena:
    """`capacity` bytes of private anonymous memory, advised as huge pages, handed out as tensors by `take`."""

    def __init__(self, capacity: int) -> None:
        """Raises ValueError when `capacity < 1`."""
        if capacity < 1:
            raise ValueError("an arena needs at least one byte")
        block = mmap.mmap(-1, capacity, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                block.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # a kernel without transparent huge pages: plain pages
                pass
        self._bytes = torch.frombuffer(block, dtype=torch.uint8)  # keeps the mapping alive as long as any view
        self._used = 0

    def take(self, source: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of `source` (any shape and dtype, on the CPU) in the arena. Raises MemoryError when the
        arena has no room left for it."""
        nbytes = source.numel() * source.element_size()
        start = -(-self._used // _ALIGN) * _ALIGN
        if start + nbytes > len(self._bytes):
            raise MemoryError(f"the arena has {len(self._bytes) - start} bytes left, not {nbytes}")
        self._used = start + nbytes
        copy = self._bytes[start : start + nbytes].view(source.dtype).view(source.shape)
        copy.copy_(source)
        return copy

    @staticmethod
    def size_for(tensors: list[torch.Tensor]) -> int:
        """The capacity `take` needs for `tensors`, in bytes."""
        return sum(-(-tensor.numel() * tensor.element_size() // _ALIGN) * _ALIGN for tensor in tensors) + _ALIGN
