"""Shared-prefix ("cascade") decode attention: decode rows whose slot tables begin with the same run of slots read
that prefix's K/V once.

Sequences on one cached system prompt get the same pool slots for it from the radix cache, so a padded decode batch
would gather and score the same prefix once per row. Here a group's prefix is read once and all the group's queries
(rows times the query heads of each KV head) are scored against it in one call per part; each row's suffix (its
slots after the prefix) is attended separately, and the partial results are merged exactly through their
log-sum-exp, in float32 (the softmax-merge rule of FlashAttention and of FlashInfer's cascade kernels).

A prefix is read without copying where it can be: its runs of at least MIN_VIEW_RUN consecutive slots are views of
the pool, attended one by one, and only its other slots (a chat template's opening shared by every prompt, a few
tokens written after it) are gathered. A group may be a single row: a long context read this way costs no gather.
On CPU (2 threads, fp32, SmolLM2's shape, 30 layers over one pool layer), 8 decode rows on 4 prompts of 1.6-1.9k
tokens (each table an opening of 10 shared slots, the prompt's run, then scattered slots) took 39 ms per step this
way against 57 ms when a prefix of several runs was gathered and each group had its own suffix pass; one row alone
took 10.2 ms against 11.8 ms on the padded path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from local_engine.cache.slot_runs import slot_runs

MIN_SHARED_PREFIX = 64  # the shortest shared run of slots worth a separate prefix pass


MIN_VIEW_RUN = 64  # a run of consecutive slots at least this long is read as a view; shorter ones are gathered


@dataclass(frozen=True)
class SlotRead:
    """A set of slots that every query attends in full, split for reading.

    `views`: `(first slot, length)` of each run of at least MIN_VIEW_RUN consecutive slots, read as views of the pool;
    `gathered`: int64 `[n]` on the pool's device, the other slots, or None when there are none. `num_slots`: the total.
    """

    views: tuple[tuple[int, int], ...]
    gathered: torch.Tensor | None
    num_slots: int


# split_runs' result: `(first slot, length)` of each long run, and the other slots.
RunSplit = tuple[tuple[tuple[int, int], ...], torch.Tensor]


def split_runs(slots: torch.Tensor, min_run: int = MIN_VIEW_RUN) -> RunSplit:
    """`slots` (int64 CPU `[n]`) as its runs of at least `min_run` consecutive slots, `(first slot, length)` each,
    and the other slots (int64 CPU, in order)."""
    if len(slots) < min_run:
        return (), slots
    long_runs = [run for run in slot_runs(slots, max_runs=len(slots)) if run[2] >= min_run]
    if not long_runs:
        return (), slots
    rest = torch.ones(len(slots), dtype=torch.bool)
    for offset, _, length in long_runs:
        rest[offset : offset + length] = False
    return tuple((first, length) for _, first, length in long_runs), slots[rest]


@dataclass(frozen=True)
class CascadeGroup:
    """Rows `[start, start + num_rows)` of a CascadeBatch, which share the slots `prefix` reads."""

    start: int
    num_rows: int
    prefix: SlotRead


@dataclass(frozen=True)
class CascadeBatch:
    """The decode rows attended through shared prefixes, group after group (a group may be one row).

    `rows`: int64 `[R]`, each cascade row's index in the packed step. `suffix_slots`: int64 `[R, max_suffix]`, each
    row's slots outside its group's prefix read, padded with slot 0 (every row has at least one, its new token's);
    `suffix_mask`: bool `[R, 1, 1, max_suffix]` marking real entries, or None when no padding was needed. All on the
    pool's device.
    """

    rows: torch.Tensor
    groups: tuple[CascadeGroup, ...]
    suffix_slots: torch.Tensor
    suffix_mask: torch.Tensor | None


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


def build_cascade_batch(
    tables: list[torch.Tensor],
    groups: list[tuple[list[int], int, RunSplit | None]],
    device: torch.device,
) -> CascadeBatch:
    """A CascadeBatch for `groups` over `tables` (int64 CPU `[n_i]`): `(rows of tables, shared prefix length, the
    prefix's split_runs when the caller has made it, else None)` each. A prefix's runs of MIN_VIEW_RUN slots or more
    are read as views; its few other slots (up to MIN_VIEW_RUN) join each row's suffix, which is attended for all
    rows at once, rather than cost a pass of their own per group."""
    rows, built, suffixes, start = [], [], [], 0
    for group_rows, prefix_length, runs in groups:
        views, rest = runs or split_runs(tables[group_rows[0]][:prefix_length])
        shared_rest = rest if views and len(rest) <= MIN_VIEW_RUN else rest[:0]
        gathered = rest if len(shared_rest) < len(rest) else None
        read = SlotRead(views, None if gathered is None else gathered.to(device, non_blocking=True),
                        prefix_length - len(shared_rest))
        built.append(CascadeGroup(start, len(group_rows), read))
        rows += group_rows
        suffixes += [torch.cat([shared_rest, tables[row][prefix_length:]]) for row in group_rows]
        start += len(group_rows)
    lengths = [len(suffix) for suffix in suffixes]
    longest = max(lengths)
    padded = torch.zeros(len(suffixes), longest, dtype=torch.int64)
    for index, suffix in enumerate(suffixes):
        padded[index, : len(suffix)] = suffix
    mask = None
    if min(lengths) != longest:
        real = torch.arange(longest).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
        mask = real.view(len(suffixes), 1, 1, longest).to(device, non_blocking=True)
    return CascadeBatch(
        torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True),
        tuple(built),
        padded.to(device, non_blocking=True),
        mask,
    )


# The CPU's fused flash-attention kernel, which also returns each row's log-sum-exp (the op behind
# F.scaled_dot_product_attention on the CPU): one call instead of two matmuls and four elementwise passes.
_FUSED_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _attend(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention and its log-sum-exp: `queries` float32 `[B, H, M, d]`, `keys`/`values` `[B, H, N, d]` in
    the pool's dtype, `mask` bool broadcastable to `[B, H, M, N]` (True = attend) -> float32 (`o` `[B, H, M, d]`,
    `lse` `[B, H, M]`). On the CPU a bf16 pool is read as it is (the fused kernel accumulates in float32), not
    converted to a float32 copy first."""
    if _FUSED_CPU is not None and queries.device.type == "cpu":
        bias = None
        if mask is not None:
            bias = torch.zeros(mask.shape, dtype=keys.dtype).masked_fill_(~mask, float("-inf"))
        out, lse = _FUSED_CPU(queries.to(keys.dtype), keys, values, 0.0, False, attn_mask=bias, scale=scaling)[:2]
        return out.float(), lse.float()
    keys, values = keys.float(), values.float()
    scores = queries @ keys.transpose(-1, -2) * scaling
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ values, torch.logsumexp(scores, dim=-1)


def cascade_attention(
    pool_k: torch.Tensor, pool_v: torch.Tensor, batch: CascadeBatch, queries: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Decode attention of every cascade row. `pool_k`, `pool_v`: `[num_slots, num_kv_heads, head_dim]` (one layer);
    `queries`: `[R, num_heads, head_dim]`, the rows in `batch.rows` order. Returns `[R, num_heads, head_dim]` in
    `queries`' dtype. Query head h reads KV head h // (num_heads // num_kv_heads), as in grouped-query attention."""
    rows, num_heads, head_dim = queries.shape
    num_kv_heads = pool_k.shape[1]
    per_kv = num_heads // num_kv_heads
    grouped = queries.float().view(rows, num_kv_heads, per_kv, head_dim)  # [R, kv, per_kv, d]

    # Prefixes: each read once, its rows' queries of a KV head side by side in the M dimension.
    o1 = torch.empty_like(grouped)
    lse1 = torch.empty(rows, num_kv_heads, per_kv, dtype=grouped.dtype, device=grouped.device)
    for group in batch.groups:
        n, end = group.num_rows, group.start + group.num_rows
        folded = grouped[group.start : end].permute(1, 0, 2, 3).reshape(1, num_kv_heads, n * per_kv, head_dim)
        o, lse = attend_slot_read(folded, pool_k, pool_v, group.prefix, scaling)
        o1[group.start : end] = o.view(num_kv_heads, n, per_kv, head_dim).transpose(0, 1)
        lse1[group.start : end] = lse.view(num_kv_heads, n, per_kv).transpose(0, 1)

    # Suffixes: every row's own slots, padded, in one pass.
    longest = batch.suffix_slots.shape[1]
    flat = batch.suffix_slots.view(-1)
    suffix_k = pool_k.index_select(0, flat).view(rows, longest, num_kv_heads, head_dim).transpose(1, 2)
    suffix_v = pool_v.index_select(0, flat).view(rows, longest, num_kv_heads, head_dim).transpose(1, 2)
    o2, lse2 = _attend(grouped, suffix_k, suffix_v, scaling, batch.suffix_mask)  # [R, kv, per_kv, d|-]

    out, _ = merge_partials([(o1, lse1), (o2, lse2)])
    return out.reshape(rows, num_heads, head_dim).to(queries.dtype)


def attend_slot_read(
    queries: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, read: SlotRead, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of float32 `queries` `[1, num_kv_heads, M, head_dim]` over every slot of `read` (no mask), one part
    per view and one for the gathered slots, merged: (`o` `[1, kv, M, d]`, `lse` `[1, kv, M]`)."""
    parts = []
    for first, length in read.views:
        keys = pool_k.narrow(0, first, length).transpose(0, 1).unsqueeze(0)  # [1, kv, length, d]
        values = pool_v.narrow(0, first, length).transpose(0, 1).unsqueeze(0)
        parts.append(_attend(queries, keys, values, scaling))
    if read.gathered is not None:
        keys = pool_k.index_select(0, read.gathered).transpose(0, 1).unsqueeze(0)
        values = pool_v.index_select(0, read.gathered).transpose(0, 1).unsqueeze(0)
        parts.append(_attend(queries, keys, values, scaling))
    return merge_partials(parts)


def merge_partials(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention over disjoint key sets, merged exactly: each part is (`o` `[..., M, d]`, `lse` `[..., M]`)
    of one key set; returns the same for their union (o = sum of o_i * exp(lse_i - lse), lse = logsumexp of lse_i)."""
    lse = parts[0][1]
    for _, part_lse in parts[1:]:
        lse = torch.logaddexp(lse, part_lse)  # pairwise: several times cheaper than logsumexp over a stack
    if len(parts) == 1:
        return parts[0]
    out = sum(part_o * torch.exp(part_lse - lse).unsqueeze(-1) for part_o, part_lse in parts)
    return out, lse
