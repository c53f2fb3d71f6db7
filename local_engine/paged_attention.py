"""Attention over the KV pool: a step's new K/V go straight into pool slots, and each sequence reads its context
through its slot table. No per-request copy of the KV exists; the pool is the only place it lives.

Plain torch (gather the slots, then scaled-dot-product attention), so it runs on CPU and CUDA alike. Decode-only
sequences (one query token each) are attended together in one padded batch; prefill chunks are attended one by one
with a causal mask offset by the tokens already in the pool. On CPU, for ~1.7k-token contexts of SmolLM2's shape,
one padded SDPA call over the decode sequences took 0.27x (8 sequences) and 0.41x (32) the time of one call per
sequence, and the same for a single sequence; a single variable-length packed call would need a mask over every pair
of packed tokens and context slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from local_engine.cache import KVPool


@dataclass(frozen=True)
class ChunkAttention:
    """One prefill chunk: packed query rows `[query_start, query_start + num_query_tokens)` attend to `slots`.

    `slots`: int64 `[num_context_tokens]` on the pool's device, the sequence's slot table up to and including this
    chunk. `mask`: bool `[num_query_tokens, num_context_tokens]` (True = attend), or None when the chunk is the whole
    context so plain causal attention applies.
    """

    query_start: int
    num_query_tokens: int
    slots: torch.Tensor
    mask: torch.Tensor | None


@dataclass(frozen=True)
class PagedBatch:
    """Where one packed step's tokens read and write their K/V in the pool.

    The packed input holds `num_decode` decode tokens first (rows `[0, num_decode)`), then the prefill chunks.
    `write_slots`: int64 `[num_tokens]`, the pool slot of each packed token's new K/V. `decode_slots`: int64
    `[num_decode, max_context_tokens]`, each decode sequence's slot table padded with slot 0; `decode_mask`: bool
    `[num_decode, 1, 1, max_context_tokens]` marking real entries, or None when no padding was needed.
    """

    pool: KVPool
    write_slots: torch.Tensor
    num_decode: int
    decode_slots: torch.Tensor | None
    decode_mask: torch.Tensor | None
    chunks: tuple[ChunkAttention, ...]


def build_paged_batch(
    pool: KVPool, slot_tables: list[torch.Tensor], num_query_tokens: list[int], num_decode: int
) -> PagedBatch:
    """`slot_tables[i]`: int64 CPU `[n_i]`, sequence i's slots up to and including its tokens in this step, whose
    count is `num_query_tokens[i]`. The first `num_decode` sequences have one query token each."""
    device = pool.k.device
    write_slots = torch.cat([table[len(table) - n :] for table, n in zip(slot_tables, num_query_tokens)])
    decode_slots = decode_mask = None
    if num_decode:
        lengths = [len(table) for table in slot_tables[:num_decode]]
        longest = max(lengths)
        padded = torch.zeros(num_decode, longest, dtype=torch.int64)
        for row, table in enumerate(slot_tables[:num_decode]):
            padded[row, : len(table)] = table
        decode_slots = padded.to(device, non_blocking=True)
        if min(lengths) != longest:
            real = torch.arange(longest).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
            decode_mask = real.view(num_decode, 1, 1, longest).to(device, non_blocking=True)
    chunks, start = [], num_decode
    for table, n in zip(slot_tables[num_decode:], num_query_tokens[num_decode:]):
        context = len(table)
        mask = None
        if context != n:
            # Query i sits at position context - n + i and sees every key up to it.
            mask = torch.ones(n, context, dtype=torch.bool).tril(diagonal=context - n).to(device, non_blocking=True)
        chunks.append(ChunkAttention(start, n, table.to(device, non_blocking=True), mask))
        start += n
    return PagedBatch(pool, write_slots.to(device, non_blocking=True), num_decode, decode_slots, decode_mask,
                      tuple(chunks))


def paged_attention(
    batch: PagedBatch, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
) -> torch.Tensor:
    """One layer's attention for a packed step.

    `query`: `[1, num_heads, num_tokens, head_dim]`; `key`, `value`: `[1, num_kv_heads, num_tokens, head_dim]`, the
    step's new K/V after rotary embedding. Writes them into the pool, then returns `[1, num_tokens, num_heads,
    head_dim]` (the layout transformers' attention functions return).
    """
    pool_k, pool_v = batch.pool.k[layer], batch.pool.v[layer]  # [num_slots, num_kv_heads, head_dim]
    pool_k.index_copy_(0, batch.write_slots, key[0].transpose(0, 1).to(pool_k.dtype))
    pool_v.index_copy_(0, batch.write_slots, value[0].transpose(0, 1).to(pool_v.dtype))
    queries = query[0].transpose(0, 1)  # [num_tokens, num_heads, head_dim]
    out = torch.empty_like(queries)
    num_kv_heads, head_dim = pool_k.shape[1], pool_k.shape[2]
    if batch.num_decode:
        rows, longest = batch.decode_slots.shape
        flat = batch.decode_slots.view(-1)
        keys = pool_k.index_select(0, flat).view(rows, longest, num_kv_heads, head_dim).transpose(1, 2)
        values = pool_v.index_select(0, flat).view(rows, longest, num_kv_heads, head_dim).transpose(1, 2)
        decode_queries = queries[:rows].unsqueeze(2).to(keys.dtype)  # [rows, num_heads, 1, head_dim]
        attended = F.scaled_dot_product_attention(
            decode_queries, keys, values, attn_mask=batch.decode_mask, scale=scaling, enable_gqa=True
        )
        out[:rows] = attended.squeeze(2).to(out.dtype)
    for chunk in batch.chunks:
        keys = pool_k.index_select(0, chunk.slots).transpose(0, 1).unsqueeze(0)  # [1, num_kv_heads, n, head_dim]
        values = pool_v.index_select(0, chunk.slots).transpose(0, 1).unsqueeze(0)
        end = chunk.query_start + chunk.num_query_tokens
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
