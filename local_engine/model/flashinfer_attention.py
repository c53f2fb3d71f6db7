"""Paged attention over the KV pool with FlashInfer's batched kernel (CUDA, flashinfer-python).

One `BatchPrefillWithPagedKVCacheWrapper` serves the whole packed step, decode rows and prefill chunks alike: a
decode row is a request with one query token, a prefill chunk one with several, and FlashInfer's causal mask for
appended queries is aligned to the end of each request's KV (query i of a chunk of n over a context of k sees KV
positions up to k - n + i), which is the engine's chunked-prefill rule. The plan (the CSR page table below) is made
once per step and reused by every layer; each layer then calls `run` on its slice of the pool.

Page table (FlashInfer's CSR layout, https://docs.flashinfer.ai/tutorials/kv_layout.html): with a page of one slot,
`kv_indices` is every request's slot table end to end, `kv_indptr[i]:kv_indptr[i+1]` is request i's part, every
last page holds one token, and `qo_indptr` delimits each request's query rows in the packed step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's scratch buffer; its examples use 128 MiB


@dataclass(frozen=True)
class PageTable:
    """int32 tensors: `qo_indptr` `[num_requests + 1]`, `kv_indptr` `[num_requests + 1]`, `kv_indices`
    `[sum of context lengths]` (slot ids), `last_page_len` `[num_requests]` (all ones: a page is one slot)."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor


def build_page_table(slot_tables: list[torch.Tensor], num_query_tokens: list[int]) -> PageTable:
    """The CSR page table of one packed step, on the CPU. `slot_tables[i]`: int64 `[n_i]`, request i's slots up to
    and including its query tokens, in packed order; `num_query_tokens[i]` of them are this step's queries.

    Raises ValueError when a request has no query token or fewer slots than query tokens.
    """
    for table, n in zip(slot_tables, num_query_tokens, strict=True):
        if n < 1 or len(table) < n:
            raise ValueError("each request needs at least one query token and a slot for every one")
    zero = torch.zeros(1, dtype=torch.int32)
    query_counts = torch.tensor(num_query_tokens, dtype=torch.int32)
    context_counts = torch.tensor([len(table) for table in slot_tables], dtype=torch.int32)
    return PageTable(
        qo_indptr=torch.cat([zero, query_counts.cumsum(0, dtype=torch.int32)]),
        kv_indptr=torch.cat([zero, context_counts.cumsum(0, dtype=torch.int32)]),
        kv_indices=torch.cat(slot_tables).to(torch.int32),
        last_page_len=torch.ones(len(slot_tables), dtype=torch.int32),
    )


class FlashInferAttention:
    """FlashInfer's batched paged attention for one engine: a workspace and a wrapper, planned once per step."""

    def __init__(self, device: torch.device, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype) -> None:
        import flashinfer  # imported here: the package exists only where CUDA does

        self.device = device
        self.num_heads, self.num_kv_heads, self.head_dim, self.dtype = num_heads, num_kv_heads, head_dim, dtype
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self._planned: PageTable | None = None

    def ensure_planned(self, table: PageTable, scale: float) -> None:
        """Prepare the kernel for one step's page table: the first layer of a step plans, the others reuse it."""
        if self._planned is table:
            return
        to_device = {name: getattr(table, name).to(self.device, non_blocking=True)
                     for name in ("qo_indptr", "kv_indptr", "kv_indices", "last_page_len")}
        self._wrapper.plan(
            to_device["qo_indptr"],
            to_device["kv_indptr"],
            to_device["kv_indices"],
            to_device["last_page_len"],
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            1,  # page size: one slot
            causal=True,
            sm_scale=scale,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        self._planned = table

    def run(self, queries: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor) -> torch.Tensor:
        """`queries`: `[num_tokens, num_heads, head_dim]` in packed order; `pool_k`, `pool_v`: one layer of the pool,
        `[num_slots, num_kv_heads, head_dim]`. Returns `[num_tokens, num_heads, head_dim]`."""
        pages = (pool_k.unsqueeze(1), pool_v.unsqueeze(1))  # [num_slots, page_size 1, num_kv_heads, head_dim]
        return self._wrapper.run(queries.to(self.dtype).contiguous(), pages)
