"""Shared-prefix ("cascade") decode attention: decode rows whose slot tables begin with the same run of slots read
that prefix's K/V once.

Sequences on one cached system prompt get the same pool slots for it from the radix cache, so a padded decode batch
would gather and score the same prefix once per row. Here a group's prefix is gathered once and all the group's
queries (rows times the query heads of each KV head) are scored against it in one matmul per KV head; each row's
suffix (its slots after the prefix) is attended separately, and the two partial results are merged exactly through
their log-sum-exp, in float32 (the softmax-merge rule of FlashAttention and of FlashInfer's cascade kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from local_engine.cache.slot_runs import slot_runs

MIN_SHARED_PREFIX = 64  # the shortest shared run of slots worth a separate prefix pass


@dataclass(frozen=True)
class CascadeGroup:
    """Decode rows sharing their first `len(prefix_slots)` slots.

    `rows`: int64 `[num_rows]`, the rows' indices in the packed step. `prefix_slots`: int64 `[P]`, the shared slots;
    `prefix_start`: the first of them when they are one ascending run of pool slots (as a prefix computed in one go
    usually is), so the prefix is read as a view of the pool instead of gathered, else None.
    `suffix_slots`: int64 `[num_rows, max_suffix]`, each row's slots after the prefix padded with slot 0 (every row
    has at least one, its new token's). `suffix_mask`: bool `[num_rows, 1, 1, max_suffix]` marking real entries, or
    None when no padding was needed. All on the pool's device.
    """

    rows: torch.Tensor
    prefix_slots: torch.Tensor
    suffix_slots: torch.Tensor
    suffix_mask: torch.Tensor | None
    prefix_start: int | None = None


def contiguous_start(slots: torch.Tensor) -> int | None:
    """The first slot of `slots` (int64 CPU `[n]`) when they are `start, start + 1, ...`, else None."""
    runs = slot_runs(slots, max_runs=1)
    return runs[0][1] if runs else None


def read_slots(pool_layer: torch.Tensor, slots: torch.Tensor, start: int | None) -> torch.Tensor:
    """Rows `slots` of one pool layer (`[num_slots, num_kv_heads, head_dim]`): a view when they are the run beginning
    at `start`, a gathered copy otherwise. Returns `[len(slots), num_kv_heads, head_dim]`."""
    if start is not None:
        return pool_layer.narrow(0, start, len(slots))
    return pool_layer.index_select(0, slots)


def find_shared_prefixes(tables: list[torch.Tensor], min_prefix: int) -> list[tuple[list[int], int]]:
    """Groups of at least two of `tables` (int64 CPU `[n_i]`) that share their first `min_prefix` slots, each with
    the length of the group's longest common prefix: `[(row indices, prefix length), ...]`. Keying on the whole
    first `min_prefix` slots (not just the first) keeps a row that shares only a short opening, such as a chat
    template's, from shrinking another group's prefix. The prefix stops short of each table's last slot so every row
    keeps a non-empty suffix."""
    by_start: dict[bytes, list[int]] = {}
    for row, table in enumerate(tables):
        if len(table) > min_prefix:
            by_start.setdefault(table[:min_prefix].numpy().tobytes(), []).append(row)
    groups = []
    for rows in by_start.values():
        if len(rows) < 2:
            continue
        limit = min(len(tables[row]) for row in rows) - 1
        stacked = torch.stack([tables[row][:limit] for row in rows])  # [num_rows, limit]
        differs = (~(stacked == stacked[:1]).all(dim=0)).nonzero()
        groups.append((rows, int(differs[0]) if len(differs) else limit))
    return groups


def build_cascade_group(
    tables: list[torch.Tensor], rows: list[int], prefix_length: int, device: torch.device
) -> CascadeGroup:
    """A CascadeGroup for `rows` of `tables` (int64 CPU `[n_i]`) sharing their first `prefix_length` slots."""
    suffixes = [tables[row][prefix_length:] for row in rows]
    lengths = [len(suffix) for suffix in suffixes]
    longest = max(lengths)
    padded = torch.zeros(len(rows), longest, dtype=torch.int64)
    for index, suffix in enumerate(suffixes):
        padded[index, : len(suffix)] = suffix
    mask = None
    if min(lengths) != longest:
        real = torch.arange(longest).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
        mask = real.view(len(rows), 1, 1, longest).to(device, non_blocking=True)
    prefix = tables[rows[0]][:prefix_length]
    return CascadeGroup(
        torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True),
        prefix.to(device, non_blocking=True),
        padded.to(device, non_blocking=True),
        mask,
        contiguous_start(prefix),
    )


# The CPU's fused flash-attention kernel, which also returns each row's log-sum-exp (the op behind
# F.scaled_dot_product_attention on the CPU): one call instead of two matmuls and four elementwise passes.
_FUSED_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _attend(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention and its log-sum-exp: `queries` float32 `[B, H, M, d]`, `keys`/`values` `[B, H, N, d]`,
    `mask` bool broadcastable to `[B, H, M, N]` (True = attend) -> (`o` `[B, H, M, d]`, `lse` `[B, H, M]`)."""
    if _FUSED_CPU is not None and queries.device.type == "cpu":
        bias = None
        if mask is not None:
            bias = torch.zeros(mask.shape, dtype=queries.dtype).masked_fill_(~mask, float("-inf"))
        out, lse = _FUSED_CPU(queries, keys, values, 0.0, False, attn_mask=bias, scale=scaling)[:2]
        return out, lse
    scores = queries @ keys.transpose(-1, -2) * scaling
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ values, torch.logsumexp(scores, dim=-1)


def cascade_attention(
    pool_k: torch.Tensor, pool_v: torch.Tensor, group: CascadeGroup, queries: torch.Tensor, scaling: float
) -> torch.Tensor:
    """One group's decode attention. `pool_k`, `pool_v`: `[num_slots, num_kv_heads, head_dim]` (one layer);
    `queries`: `[num_rows, num_heads, head_dim]`, the group's rows. Returns `[num_rows, num_heads, head_dim]` in
    `queries`' dtype. Query head h reads KV head h // (num_heads // num_kv_heads), as in grouped-query attention."""
    rows, num_heads, head_dim = queries.shape
    num_kv_heads = pool_k.shape[1]
    per_kv = num_heads // num_kv_heads
    grouped = queries.float().view(rows, num_kv_heads, per_kv, head_dim)  # [rows, kv, per_kv, d]

    # Prefix: read once, every row's queries of a KV head side by side in the M dimension.
    prefix_k = read_slots(pool_k, group.prefix_slots, group.prefix_start).transpose(0, 1).float()  # [kv, P, d]
    prefix_v = read_slots(pool_v, group.prefix_slots, group.prefix_start).transpose(0, 1).float()
    folded = grouped.permute(1, 0, 2, 3).reshape(1, num_kv_heads, rows * per_kv, head_dim)  # [1, kv, rows*per_kv, d]
    o1, lse1 = _attend(folded, prefix_k.unsqueeze(0), prefix_v.unsqueeze(0), scaling)
    o1 = o1.view(num_kv_heads, rows, per_kv, head_dim).transpose(0, 1)  # [rows, kv, per_kv, d]
    lse1 = lse1.view(num_kv_heads, rows, per_kv).transpose(0, 1)

    # Suffix: each row's own slots, padded.
    longest = group.suffix_slots.shape[1]
    flat = group.suffix_slots.view(-1)
    suffix_k = pool_k.index_select(0, flat).view(rows, longest, num_kv_heads, head_dim).transpose(1, 2).float()
    suffix_v = pool_v.index_select(0, flat).view(rows, longest, num_kv_heads, head_dim).transpose(1, 2).float()
    o2, lse2 = _attend(grouped, suffix_k, suffix_v, scaling, group.suffix_mask)  # [rows, kv, per_kv, d|-]

    # Merge the two partial softmaxes exactly through their log-sum-exps.
    lse = torch.logaddexp(lse1, lse2)
    out = o1 * torch.exp(lse1 - lse).unsqueeze(-1) + o2 * torch.exp(lse2 - lse).unsqueeze(-1)
    return out.reshape(rows, num_heads, head_dim).to(queries.dtype)
