"""Batch-invariant CPU kernels (local_engine/model/csrc/invariant.c): a matmul and paged attention whose every output
element is computed by one fixed sequence of float32 operations, whatever else shares the call.

A token's K/V and logits are then the same bits whether it was computed in a long prefill chunk, as a decode row
beside 31 others, or after its prefix came from the cache (any tier), so greedy and seeded answers cannot depend on
the cache state or the batch. The orders are the C file's header; in short: the matmul sums each output over the
input features in order, one fused multiply-add each, on a weight packed once into panels of `PANEL` output columns
(`PanelWeight`); attention computes each query row's scores, an exact max, exp, the key-ordered sum and the
key-ordered weighted sum of values over its own context only (`plan_attention`, `attention`).

They need the CPU kernels (`cpu_kernels.available()`), float32 activations, and weights and a pool stored in float32
or bfloat16 (widened exactly). The cost against the default kernels is measured by `prefixscope bench engine`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from local_engine.model import cpu_kernels, kernel_extension
from local_engine.model.kernel_ops import STORED_DTYPES, Launch, describe, expect, int64s, kernel_op, stored


def _constant(name: str) -> int:
    """A constant of the extension (PANEL, QUERY_BLOCK), which declares them once for the C and for Python."""
    module, reason = kernel_extension.extension()
    if module is None:
        raise RuntimeError(f"the CPU kernels do not run here: {reason}")
    return getattr(module, name)


def runs(dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int) -> bool:
    """Whether these kernels serve a model whose weights and pool are `dtype`, with `heads` query heads over
    `kv_heads` KV heads of `head_dim`: float32 or bfloat16, head_dim a multiple of 8 up to 256, whole GQA groups, the
    CPU kernels available."""
    return (dtype in STORED_DTYPES and head_dim % 8 == 0 and head_dim <= 256 and kv_heads >= 1 and heads % kv_heads == 0
            and cpu_kernels.available())


class PanelWeight:
    """A weight `[out_features, in_features]` (float32 or bfloat16, on the CPU) packed once as
    `[ceil(out_features / PANEL), in_features, PANEL]`, zero columns past `out_features`. Call it with float32 `x`
    `[rows, in_features]` (rows may lie further apart, features contiguous) for float32 `x @ weight.T`
    `[rows, out_features]`. Raises ValueError for another dtype or a feature count that differs."""

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dtype not in STORED_DTYPES or weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(f"a {weight.dtype} weight of {tuple(weight.shape)} on {weight.device} cannot be packed")
        panel = _constant("INVARIANT_PANEL")
        self.out_features, self.in_features = weight.shape
        padded = F.pad(weight.detach(), (0, 0, 0, (-self.out_features) % panel))
        self.panels = padded.view(-1, panel, self.in_features).transpose(1, 2).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)
        _panel_linear(x, self.panels, self.out_features, out)
        return out


@kernel_op(mutates=("out",))
def _panel_linear(x: torch.Tensor, panels: torch.Tensor, out_features: int, out: torch.Tensor) -> Launch:
    stored(panels, "panels", 3)
    num_panels, in_features, panel = panels.shape
    expect(x.dim() == 2 and x.dtype == torch.float32 and x.is_cpu and x.stride(1) == 1 and x.shape[1] == in_features,
           lambda: f"x: float32 CPU rows of {in_features} contiguous features, got {describe(x)}")
    expect(panel == _constant("INVARIANT_PANEL") and 0 < out_features <= num_panels * panel
           and out_features > (num_panels - 1) * panel,
           lambda: f"panels {describe(panels)} do not hold a weight of {out_features} outputs")
    expect(out.dtype == torch.float32 and out.is_cpu and out.is_contiguous()
           and tuple(out.shape) == (x.shape[0], out_features),
           lambda: f"out: contiguous float32 [{x.shape[0]}, {out_features}], got {describe(out)}")
    return lambda ext: ext.panel_linear(x.data_ptr(), panels.data_ptr(), out.data_ptr(), x.shape[0], out_features,
                                        in_features, x.stride(0), out_features, panels.dtype == torch.bfloat16,
                                        torch.get_num_threads())


@dataclass(frozen=True)
class AttentionPlan:
    """How a step's query rows attend, built once per step for every layer.

    `slots`: int64 `[sequences, longest]`, each sequence's slot table padded with zeros; `blocks`: int64
    `[num_blocks, 4]`, each (sequence, first query row, rows, the first row's context) for up to QUERY_BLOCK
    consecutive query rows of one sequence: row r of a block attends its sequence's first `context + r` slots.
    `rows`: the step's query rows; `max_slot`: the largest slot read."""

    slots: torch.Tensor
    blocks: torch.Tensor
    longest: int
    rows: int
    max_slot: int


def plan_attention(tables: list[torch.Tensor], num_query_tokens: list[int]) -> AttentionPlan:
    """The plan for a packed step whose sequences, in packed order, have slot tables `tables` (int64 CPU `[n_i]`,
    up to and including this step's tokens) and `num_query_tokens[i]` tokens in the step (the last of the table).
    Raises ValueError for a sequence with no token in the step or more tokens than slots, or a negative slot."""
    block = _constant("INVARIANT_QUERY_BLOCK")
    longest = max(len(table) for table in tables)
    slots = torch.zeros(len(tables), longest, dtype=torch.int64)
    blocks, row, lowest, highest = [], 0, 0, 0
    for index, (table, tokens) in enumerate(zip(tables, num_query_tokens, strict=True)):
        if tokens < 1 or tokens > len(table):
            raise ValueError(f"a sequence of {len(table)} slots cannot have {tokens} tokens in a step")
        slots[index, : len(table)] = table
        lowest, highest = min(lowest, int(table.min())), max(highest, int(table.max()))
        first_context = len(table) - tokens + 1
        for start in range(0, tokens, block):
            blocks.append((index, row + start, min(block, tokens - start), first_context + start))
        row += tokens
    if lowest < 0:
        raise ValueError(f"a negative slot {lowest}")
    return AttentionPlan(slots, torch.tensor(blocks, dtype=torch.int64), longest, row, highest)


_workspaces = threading.local()  # each calling thread's score buffers, grown to the largest call so far


def attention(query: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, plan: AttentionPlan, scale: float,
              out: torch.Tensor) -> None:
    """Each query row attends its own context as `plan` says.

    `query`: float32 `[tokens, heads, head_dim]`, heads head_dim apart (rows may lie further apart, as in a view of a
    step's qkv output); `pool_k`, `pool_v`: one layer of the pool, contiguous float32 or bfloat16
    `[num_slots, kv_heads, head_dim]` on the CPU; `out`: float32 `[tokens, heads, head_dim]`, heads head_dim apart.
    Raises ValueError for tensors of other shapes, dtypes or layouts, a plan for another number of rows, and
    IndexError for a plan that reads a slot outside the pool, in each case before anything is written."""
    expect(query.dim() == 3 and query.shape[0] == plan.rows,
           lambda: f"a plan of {plan.rows} rows for queries {describe(query)}")
    if plan.max_slot >= pool_k.shape[0]:
        raise IndexError(f"slot {plan.max_slot} is outside a pool of {pool_k.shape[0]}")
    threads = torch.get_num_threads()
    needed = threads * (plan.longest + 8)
    workspace = getattr(_workspaces, "buffer", None)
    if workspace is None or workspace.numel() < needed:
        workspace = _workspaces.buffer = torch.empty(needed, dtype=torch.float32)
    _invariant_attention(query, pool_k, pool_v, plan.slots, plan.blocks, plan.longest, scale, workspace, out)


@kernel_op(mutates=("workspace", "out"))
def _invariant_attention(query: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, slots: torch.Tensor,
                         blocks: torch.Tensor, longest: int, scale: float, workspace: torch.Tensor,
                         out: torch.Tensor) -> Launch:
    tokens, heads, head_dim = query.shape if query.dim() == 3 else (0, 0, 0)
    expect(query.dim() == 3 and query.dtype == torch.float32 and query.is_cpu and query.stride(2) == 1
           and query.stride(1) == head_dim,
           lambda: f"query: float32 CPU [tokens, heads, head_dim], heads head_dim apart, got {describe(query)}")
    for name, x in (("pool_k", pool_k), ("pool_v", pool_v)):
        stored(x, name, 3)
    kv_heads = pool_k.shape[1]
    expect(pool_v.shape == pool_k.shape and pool_v.dtype == pool_k.dtype and pool_k.shape[2] == head_dim
           and runs(pool_k.dtype, head_dim, heads, kv_heads),
           lambda: f"queries {describe(query)} cannot attend a pool layer {describe(pool_k)} and {describe(pool_v)}")
    expect(out.dtype == torch.float32 and out.is_cpu and out.shape == query.shape and out.stride(2) == 1
           and out.stride(1) == head_dim, lambda: f"out {describe(out)} for queries {describe(query)}")
    int64s(slots, "slots", 2)
    int64s(blocks, "blocks", 2)
    expect(blocks.shape[1] == 4 and slots.shape[1] == longest
           and workspace.dtype == torch.float32 and workspace.is_contiguous()
           and workspace.numel() >= torch.get_num_threads() * (longest + 8),
           lambda: f"a plan {describe(slots)}, {describe(blocks)} and workspace {describe(workspace)} that do not fit")
    return lambda ext: ext.invariant_attention(
        query.data_ptr(), query.stride(0), pool_k.data_ptr(), pool_v.data_ptr(), slots.data_ptr(), longest,
        blocks.data_ptr(), len(blocks), out.data_ptr(), out.stride(0), heads, kv_heads, head_dim, longest, scale,
        pool_k.dtype == torch.bfloat16, workspace.data_ptr(), torch.get_num_threads())
