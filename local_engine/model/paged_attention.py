"""Attention over the KV pool: a step's new K/V go straight into pool slots, and each sequence reads its context
through its slot table. No per-request copy of the KV exists; the pool is the only place it lives.

Plain torch (gather the slots, then scaled-dot-product attention), so it runs on CPU and CUDA alike; on CUDA with
flashinfer-python installed, one FlashInfer kernel per layer attends the whole step instead
(local_engine.model.flashinfer_attention, chosen by local_engine.model.attention_backends), and on a CPU with
local_engine.model.cpu_kernels (a float32 or bf16 pool), its decode kernel attends every decode row (a DecodePlan per
step), and on a CPU with AMX-BF16 its chunk kernel attends a bf16 pool's prefill chunks of float32 queries (the
chunks the CPU kernels compute: cpu_kernels.chunk_attention; SmolLM2, 25 tokens after 2,048 cached, 2-core Xeon: 0.30
ms a layer against SDPA's 0.42-0.45). Decode-only sequences (one query token each) are attended together in one padded
batch; prefill chunks are attended one by one with a causal mask offset by the tokens already in the pool. On CPU, for
~1.7k-token contexts of SmolLM2's shape, one padded SDPA call over the decode sequences took 0.27x (8 sequences) and
0.41x (32) the time of one call per sequence, and the same for a single sequence; a single variable-length packed call
would need a mask over every pair of packed tokens and context slots.

Decode sequences whose slot tables begin with the same run of at least MIN_SHARED_PREFIX slots (sequences on one
cached system prompt) are attended as a cascade group instead (local_engine.model.cascade_attention): the shared prefix
is read (as views of its long runs of slots) and scored once for the whole group, every row's own suffix in one
padded pass, and the parts merged exactly; in float32, a row alone on a long run of slots is a group of its own. On
CPU (one thread, fp32, one layer of SmolLM2's shape: 9 heads, 3 KV heads, head_dim 64), with every sequence on a
shared 1,700-token prefix plus 1-40 tokens of its own, one decode attention call took, best of 25 (median in
brackets), 14.0-15.8 ms (25 ms) for 8 sequences and 76-90 ms (83-111 ms) for 32 on the padded path, against
2.3-2.5 ms (2.6-3.4 ms) and 4.1-4.3 ms (4.5-8.7 ms) as a cascade group; finding the groups costs 0.2-1.2 ms once
per step in build_paged_batch. A row alone stays on the padded path in bf16: on 2 threads, 30 layers of one row on a
1,800-token run plus 30 slots of its own took 13.9 ms gathered against 17.5 ms as a group of one (and 19.9 against
30.2 ms for two rows on different prompts); in float32, 24.5 against 22.6 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from local_engine.cache import KVPool
from local_engine.model import cpu_kernels
from local_engine.model.flashinfer_attention import FlashInferAttention, PageTable, build_page_table
from local_engine.model.cascade_attention import (
    MIN_SHARED_PREFIX,
    CascadeBatch,
    build_cascade_batch,
    cascade_attention,
    contiguous_start,
    find_shared_prefixes,
    read_slots,
    split_runs,
)


@dataclass(frozen=True)
class ChunkAttention:
    """One prefill chunk: packed query rows `[query_start, query_start + num_query_tokens)` attend to `slots`.

    `slots`: int64 `[num_context_tokens]` on the pool's device, the sequence's slot table up to and including this
    chunk; `slots_start` its first slot when they are one ascending run (read as a view of the pool), else None.
    `mask`: bool `[num_query_tokens, num_context_tokens]` (True = attend), or None when the chunk is the whole context
    so plain causal attention applies.
    """

    query_start: int
    num_query_tokens: int
    slots: torch.Tensor
    mask: torch.Tensor | None
    slots_start: int | None = None


@dataclass(frozen=True)
class PagedBatch:
    """Where one packed step's tokens read and write their K/V in the pool.

    The packed input holds `num_decode` decode tokens first (rows `[0, num_decode)`), then the prefill chunks.
    `write_slots`: int64 `[num_tokens]`, the pool slot of each packed token's new K/V. Decode rows that share a
    prefix, or read a long run of slots alone, are attended through `cascade`; the others, `decode_rows` (int64
    `[num_plain]`, or None for all of `[0, num_decode)`), through the padded path, or none when `decode_slots` is None:
    `decode_slots`: int64 `[num_plain, max_context_tokens]`, each such row's slot table padded with slot 0;
    `decode_mask`: bool `[num_plain, 1, 1, max_context_tokens]` marking real entries, or None when no padding was
    needed.
    """

    pool: KVPool
    write_slots: torch.Tensor
    num_decode: int
    decode_slots: torch.Tensor | None
    decode_mask: torch.Tensor | None
    chunks: tuple[ChunkAttention, ...]
    decode_rows: torch.Tensor | None = None
    cascade: CascadeBatch | None = None
    # With a FlashInfer kernel every row is attended by it through `page_table` instead of the torch paths above.
    kernel: FlashInferAttention | None = None
    page_table: PageTable | None = None
    # On a CPU with local_engine.model.cpu_kernels: every decode row is attended by its kernel instead.
    decode_plan: cpu_kernels.DecodePlan | None = None


def build_paged_batch(
    pool: KVPool,
    slot_tables: list[torch.Tensor],
    num_query_tokens: list[int],
    num_decode: int,
    min_shared_prefix: int | None = MIN_SHARED_PREFIX,
    kernel: FlashInferAttention | None = None,
) -> PagedBatch:
    """`slot_tables[i]`: int64 CPU `[n_i]`, sequence i's slots up to and including its tokens in this step, whose
    count is `num_query_tokens[i]`. The first `num_decode` sequences have one query token each; two or more of
    them whose tables share their first `min_shared_prefix` or more slots form a cascade group (None: never).
    With `kernel`, the step is attended by FlashInfer through one page table instead."""
    device = pool.k.device
    write_slots = torch.cat([table[len(table) - n :] for table, n in zip(slot_tables, num_query_tokens)])
    if kernel is not None:
        return PagedBatch(pool, write_slots.to(device, non_blocking=True), num_decode, None, None, (),
                          kernel=kernel, page_table=build_page_table(slot_tables, num_query_tokens))
    decode_slots = decode_mask = decode_rows = cascade = None
    shared = (find_shared_prefixes(slot_tables[:num_decode], min_shared_prefix)
              if num_decode > 1 and min_shared_prefix is not None else [])
    if num_decode and cpu_kernels.attends(pool.k):
        return PagedBatch(pool, write_slots, num_decode, None, None, _prefill_chunks(slot_tables, num_query_tokens,
                          num_decode, device), decode_plan=cpu_kernels.plan_decode(slot_tables[:num_decode], shared))
    plain = list(range(num_decode))
    if num_decode and min_shared_prefix is not None:
        groups = [(rows, length, None) for rows, length in shared]
        grouped = {row for rows, _ in shared for row in rows}
        plain = []
        alone_as_group = pool.k.dtype == torch.float32
        for row in range(num_decode):
            if row in grouped:
                continue
            # In float32, a row alone on a context with a long run of slots is a group of its own, so that run is
            # read as a view instead of gathered. In bf16 the gather costs half as much and the padded path wins.
            runs = split_runs(slot_tables[row][:-1]) if alone_as_group else ((), None)
            if runs[0]:
                groups.append(([row], len(slot_tables[row]) - 1, runs))
            else:
                plain.append(row)
        if groups:
            cascade = build_cascade_batch(slot_tables, groups, device)
            if plain:
                decode_rows = torch.tensor(plain, dtype=torch.int64).to(device, non_blocking=True)
    if plain:
        tables = [slot_tables[row] for row in plain]
        lengths = [len(table) for table in tables]
        longest = max(lengths)
        padded = torch.zeros(len(plain), longest, dtype=torch.int64)
        for row, table in enumerate(tables):
            padded[row, : len(table)] = table
        decode_slots = padded.to(device, non_blocking=True)
        if min(lengths) != longest:
            real = torch.arange(longest).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
            decode_mask = real.view(len(plain), 1, 1, longest).to(device, non_blocking=True)
    return PagedBatch(pool, write_slots.to(device, non_blocking=True), num_decode, decode_slots, decode_mask,
                      _prefill_chunks(slot_tables, num_query_tokens, num_decode, device), decode_rows, cascade)


def _prefill_chunks(slot_tables: list[torch.Tensor], num_query_tokens: list[int], num_decode: int,
                    device: torch.device) -> tuple[ChunkAttention, ...]:
    """The ChunkAttention of every sequence after the first `num_decode`, in packed order."""
    chunks, start = [], num_decode
    for table, n in zip(slot_tables[num_decode:], num_query_tokens[num_decode:]):
        context = len(table)
        mask = None
        if context != n:
            # Query i sits at position context - n + i and sees every key up to it.
            mask = torch.ones(n, context, dtype=torch.bool).tril(diagonal=context - n).to(device, non_blocking=True)
        chunks.append(ChunkAttention(start, n, table.to(device, non_blocking=True), mask, contiguous_start(table)))
        start += n
    return tuple(chunks)


def paged_attention(
    batch: PagedBatch, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
) -> torch.Tensor:
    """One layer's attention for a packed step.

    `query`: `[1, num_heads, num_tokens, head_dim]`; `key`, `value`: `[1, num_kv_heads, num_tokens, head_dim]`, the
    step's new K/V after rotary embedding. Writes them into the pool, then returns `[1, num_tokens, num_heads,
    head_dim]` (the layout transformers' attention functions return).
    """
    pool_k, pool_v = batch.pool.k[layer], batch.pool.v[layer]  # [num_slots, num_kv_heads, head_dim]
    new_k, new_v = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [num_tokens, num_kv_heads, head_dim]
    if new_k.dtype == torch.float32 and batch.kernel is None and cpu_kernels.attends(pool_k):
        cpu_kernels.store(pool_k, batch.write_slots, new_k)  # no cast, no gather of the step's rows
        cpu_kernels.store(pool_v, batch.write_slots, new_v)
    else:
        pool_k.index_copy_(0, batch.write_slots, new_k.to(pool_k.dtype))
        pool_v.index_copy_(0, batch.write_slots, new_v.to(pool_v.dtype))
    queries = query[0].transpose(0, 1)  # [num_tokens, num_heads, head_dim]
    if batch.kernel is not None:
        batch.kernel.ensure_planned(batch.page_table, scaling)
        return batch.kernel.run(queries, pool_k, pool_v).to(queries.dtype).unsqueeze(0)
    out = torch.empty(queries.shape, dtype=queries.dtype, device=queries.device)  # contiguous: kernels write rows
    num_kv_heads, head_dim = pool_k.shape[1], pool_k.shape[2]
    if batch.cascade is not None:
        rows = batch.cascade.rows
        cascade_queries = queries.index_select(0, rows).to(pool_k.dtype)  # [R, num_heads, head_dim]
        attended = cascade_attention(pool_k, pool_v, batch.cascade, cascade_queries, scaling)
        out.index_copy_(0, rows, attended.to(out.dtype))
    if batch.decode_plan is not None:
        rows = batch.decode_plan.rows
        if out.dtype == torch.float32:
            cpu_kernels.decode_attention(queries[:rows], pool_k, pool_v, batch.decode_plan, scaling, out[:rows])
        else:
            out[:rows] = cpu_kernels.decode_attention(queries[:rows], pool_k, pool_v, batch.decode_plan, scaling)
    if batch.decode_slots is not None:
        rows, longest = batch.decode_slots.shape
        flat = batch.decode_slots.view(-1)
        keys = pool_k.index_select(0, flat).view(rows, longest, num_kv_heads, head_dim).transpose(1, 2)
        values = pool_v.index_select(0, flat).view(rows, longest, num_kv_heads, head_dim).transpose(1, 2)
        plain = queries[:rows] if batch.decode_rows is None else queries.index_select(0, batch.decode_rows)
        decode_queries = plain.unsqueeze(2).to(keys.dtype)  # [rows, num_heads, 1, head_dim]
        attended = F.scaled_dot_product_attention(
            decode_queries, keys, values, attn_mask=batch.decode_mask, scale=scaling, enable_gqa=True
        )
        if batch.decode_rows is None:
            out[:rows] = attended.squeeze(2).to(out.dtype)
        else:
            out.index_copy_(0, batch.decode_rows, attended.squeeze(2).to(out.dtype))
    # A chunk's float32 queries (the CPU kernels' short steps) on a CPU with AMX: the kernel reads the pool itself.
    on_amx = queries.dtype == torch.float32 and bool(batch.chunks) and cpu_kernels.chunk_attends(pool_k)
    for chunk in batch.chunks:
        end = chunk.query_start + chunk.num_query_tokens
        if on_amx:
            cpu_kernels.chunk_attention(queries[chunk.query_start : end], pool_k, pool_v, chunk.slots, scaling,
                                        out[chunk.query_start : end])
            continue
        keys = read_slots(pool_k, chunk.slots, chunk.slots_start).transpose(0, 1).unsqueeze(0)  # [1, kv, n, d]
        values = read_slots(pool_v, chunk.slots, chunk.slots_start).transpose(0, 1).unsqueeze(0)
        chunk_queries = queries[chunk.query_start : end].transpose(0, 1).unsqueeze(0).to(keys.dtype)
        attended = F.scaled_dot_product_attention(
            chunk_queries,
            keys,
            values,
            attn_mask=chunk.mask,
            is_causal=chunk.mask is None and chunk.num_query_tokens > 1,
            scale=scaling,
            enable_gqa=True,
        )
        out[chunk.query_start : end] = attended[0].transpose(0, 1).to(out.dtype)
    return out.unsqueeze(0)
