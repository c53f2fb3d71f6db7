"""How a step's decode rows are attended by the CPU kernels (local_engine.model.cpu_kernels): the DecodePlan built
once per step for every layer, and the DecodeStep that runs every decoder layer in one call. Plain data and its
planning, no kernel calls."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_SPLIT_TOKENS = 512  # contexts are attended in parts of at most about this many tokens, one part per thread at least


@dataclass(frozen=True)
class DecodePlan:
    """How one step's decode rows are attended by `decode_attention`, built once per step for every layer.

    `slots`: int64 `[rows, longest]`, each row's slot table padded with zeros; `segments`: int64
    `[num_segments, 5]`, each (row whose table is read, first position, end position, first index into
    `segment_rows`, number of rows), largest first; `segment_rows`: int64, the rows attending each segment."""

    slots: torch.Tensor
    segments: torch.Tensor
    segment_rows: torch.Tensor

    @property
    def rows(self) -> int:
        return self.slots.shape[0]


def plan_decode(tables: list[torch.Tensor], groups: list[tuple[list[int], int]],
                threads: int | None = None) -> DecodePlan:
    """A DecodePlan for rows whose slot tables are `tables` (int64 CPU `[n_i]`, ending with the row's new token):
    each of `groups` (`(rows, shared prefix length)`, as `find_shared_prefixes` returns) reads its shared prefix
    once for all its rows, in parts, and each of its rows reads the rest alone; a row in no group reads its table in
    parts. Parts are at most about _SPLIT_TOKENS long, and there are at least `threads` (default: torch's)."""
    threads = threads or torch.get_num_threads()
    lengths = [len(table) for table in tables]
    slots = torch.zeros(len(tables), max(lengths), dtype=torch.int64)
    for row, table in enumerate(tables):
        slots[row, : len(table)] = table
    grouped = {row for rows, _ in groups for row in rows}
    spans = [([row], row, 0, lengths[row]) for row in range(len(tables)) if row not in grouped]
    for rows, shared in groups:
        spans.append((rows, rows[0], 0, shared))
        spans.extend(([row], row, shared, lengths[row]) for row in rows)
    tokens = sum(end - start for _, _, start, end in spans)
    part = max(1, min(_SPLIT_TOKENS, tokens // threads))
    segments, segment_rows = [], []
    for rows, table_row, start, end in spans:
        parts = max(1, -(-(end - start) // part))
        for index in range(parts):
            first, last = start + (end - start) * index // parts, start + (end - start) * (index + 1) // parts
            segments.append(((last - first) * (2 + len(rows)), [table_row, first, last, len(segment_rows), len(rows)]))
            segment_rows.extend(rows)
    segments.sort(key=lambda segment: -segment[0])
    return DecodePlan(slots, torch.tensor([fields for _, fields in segments], dtype=torch.int64),
                      torch.tensor(segment_rows, dtype=torch.int64))



@dataclass(frozen=True)
class DecodeStep:
    """A step whose every row is one decode token attended by `decode_attention`: its `plan`, the pool slot of each
    row's new K/V (`write_slots`, int64 `[rows]`) and the whole pool (`pool_k`, `pool_v`: contiguous
    `[num_layers, num_slots, kv_heads, head_dim]`)."""

    plan: DecodePlan
    write_slots: torch.Tensor
    pool_k: torch.Tensor
    pool_v: torch.Tensor
