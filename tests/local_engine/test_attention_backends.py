"""Choosing the attention backend, and the page table handed to FlashInfer's kernel.

FlashInfer runs only on CUDA, so on the CPU the page table is checked by reading it the way FlashInfer's CSR layout
is documented (request i's queries are rows `qo_indptr[i]:qo_indptr[i+1]`, its KV the slots
`kv_indices[kv_indptr[i]:kv_indptr[i+1]]`, the causal mask aligned to the end of its KV) and comparing the attention
that reading gives with the torch path's on the same mixed step.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from local_engine.model.attention_backends import resolve_attention_backend
from local_engine.model.flashinfer_attention import build_page_table

from .test_cascade_attention import HEAD_DIM, NUM_HEADS, NUM_KV_HEADS, SCALING, mixed_tables, run


def test_auto_is_the_torch_path_on_the_cpu():
    assert resolve_attention_backend("auto", torch.device("cpu")) == "torch"
    assert resolve_attention_backend("torch", torch.device("cpu")) == "torch"


@pytest.mark.parametrize("name, message", [("flashinfer", "needs a CUDA device"), ("triton", "unknown attention")])
def test_a_backend_that_cannot_run_is_refused(name, message):
    with pytest.raises(ValueError, match=message):
        resolve_attention_backend(name, torch.device("cpu"))


def test_the_engine_command_refuses_flashinfer_on_the_cpu_before_loading_a_model():
    result = subprocess.run(
        [sys.executable, "-m", "prefixscope", "engine", "--device", "cpu", "--attention-backend", "flashinfer",
         "--model", "/nonexistent-model-dir"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "needs a CUDA device" in result.stderr and "Traceback" not in result.stderr


def test_page_table_layout():
    tables = [torch.tensor([7, 3, 9]), torch.tensor([1, 2]), torch.tensor([5, 6, 8, 4])]
    table = build_page_table(tables, [1, 1, 3])
    assert table.qo_indptr.tolist() == [0, 1, 2, 5]
    assert table.kv_indptr.tolist() == [0, 3, 5, 9]
    assert table.kv_indices.tolist() == [7, 3, 9, 1, 2, 5, 6, 8, 4]
    assert table.last_page_len.tolist() == [1, 1, 1]
    assert {t.dtype for t in (table.qo_indptr, table.kv_indptr, table.kv_indices, table.last_page_len)} == {
        torch.int32}


@pytest.mark.parametrize("tables, counts", [([torch.tensor([1])], [0]), ([torch.tensor([1])], [2])])
def test_page_table_refuses_a_request_without_queries_or_slots(tables, counts):
    with pytest.raises(ValueError):
        build_page_table(tables, counts)


def attend_as_flashinfer_reads(table, query, pool) -> torch.Tensor:
    """Attention over the pool, as FlashInfer reads a page-size-1 CSR page table with `causal=True`."""
    queries = query[0].transpose(0, 1)  # [num_tokens, num_heads, head_dim]
    out = torch.empty_like(queries)
    qo, kv = table.qo_indptr.tolist(), table.kv_indptr.tolist()
    for i in range(len(qo) - 1):
        slots = table.kv_indices[kv[i] : kv[i + 1]].long()
        num_q, num_kv = qo[i + 1] - qo[i], kv[i + 1] - kv[i]
        keys = pool.k[0][slots].transpose(0, 1).unsqueeze(0)  # [1, num_kv_heads, num_kv, head_dim]
        values = pool.v[0][slots].transpose(0, 1).unsqueeze(0)
        mask = torch.ones(num_q, num_kv, dtype=torch.bool).tril(diagonal=num_kv - num_q)
        rows = queries[qo[i] : qo[i + 1]].transpose(0, 1).unsqueeze(0)
        attended = F.scaled_dot_product_attention(rows, keys, values, attn_mask=mask, scale=SCALING, enable_gqa=True)
        out[qo[i] : qo[i + 1]] = attended[0].transpose(0, 1)
    return out


def test_the_page_table_describes_the_attention_the_torch_path_computes():
    tables, counts = mixed_tables()  # decode rows on shared prefixes, a lone row, and a 4-token prefill chunk
    _, torch_out, query, pool = run(tables, counts, 7, 64)  # the pool now holds the step's new K/V as well
    reference = attend_as_flashinfer_reads(build_page_table(tables, counts), query, pool)
    assert reference.shape == (sum(counts), NUM_HEADS, HEAD_DIM) and NUM_KV_HEADS == 3
    assert (torch_out - reference).abs().max() <= 1e-5
