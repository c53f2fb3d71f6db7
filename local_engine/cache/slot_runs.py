"""Slot lists as runs of consecutive slot ids, so whole-layer copies between pools are a few `narrow().copy_()`.

The allocator hands out slots from the front of its free list and takes them back at the end, so a node's slots are
usually one ascending run, or a handful after churn. A copy over a run touches every layer in one strided memcpy
(pool tensors are `[num_layers, num_slots, num_kv_heads, head_dim]`); an index_select / index_copy_ over the same
slots builds an index and gathers row by row, which is several times slower on CPU.
"""

from __future__ import annotations

import torch

# Past this many runs a gather/scatter is cheaper than launching one copy per run.
MAX_RUNS = 32


def slot_runs(slots: torch.Tensor, max_runs: int = MAX_RUNS) -> list[tuple[int, int, int]] | None:
    """`slots` (int64 `[n]`, any device) as ascending runs `(offset in slots, first slot id, length)`, in order;
    None when there are more than `max_runs` of them (scattered slots: gather instead). Empty for no slot."""
    n = int(slots.numel())
    if n == 0:
        return []
    cpu = slots.to("cpu")
    if n > 1:
        breaks = (torch.nonzero(cpu[1:] - cpu[:-1] != 1).flatten() + 1).tolist()
    else:
        breaks = []
    if len(breaks) >= max_runs:
        return None
    starts = [0, *breaks]
    ends = [*breaks, n]
    first_ids = cpu[starts].tolist()
    return [(start, first, end - start) for start, first, end in zip(starts, first_ids, ends)]


def joint_runs(
    source: list[tuple[int, int, int]], target: list[tuple[int, int, int]]
) -> list[tuple[int, int, int]]:
    """Pieces `(source first slot, target first slot, length)` that are one run on both sides, from the runs of two
    equally long slot lists (`slot_runs` of each), in order."""
    pieces = []
    i = j = 0
    position = 0
    while i < len(source) and j < len(target):
        s_offset, s_first, s_length = source[i]
        t_offset, t_first, t_length = target[j]
        end = min(s_offset + s_length, t_offset + t_length)
        pieces.append((s_first + position - s_offset, t_first + position - t_offset, end - position))
        position = end
        if end == s_offset + s_length:
            i += 1
        if end == t_offset + t_length:
            j += 1
    return pieces
