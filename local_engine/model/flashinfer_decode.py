"""FlashInfer's decode kernel in captured decode steps (CUDA, flashinfer-python; imported only where it runs).

One `BatchDecodeWithPagedKVCacheWrapper` per padded size, built for CUDA graphs (`use_cuda_graph=True`), which fixes
its batch size and binds it to page-table buffers of its own: `paged_kv_indptr_buffer` and
`paged_kv_last_page_len_buffer` are the size's DecodeBuffers `kv_indptr` and `last_page_len`, and
`paged_kv_indices_buffer` a second buffer the size of `kv_indices`. `plan`, on the host before each replay and
before the capture, copies the step's page table into them and chooses a launch configuration that stays valid for
any contexts of that batch size; `run(q, (k_cache, v_cache))` is what the graph captures. The plan is given the
indptr and last-page lengths from the (page-locked) host staging copy, which it reads there without a device round
trip, and the indices from the device buffer DecodeGraphs has just filled: FlashInfer copies indices that are on
its device asynchronously and those from the host synchronously, so planning never waits for the device.

Page table as in local_engine.model.flashinfer_attention: the pool's layer `[num_slots, num_kv_heads, head_dim]` is an
NHD paged cache with a page of one slot, so every last page holds one token.
"""

from __future__ import annotations

import torch

from local_engine.model.decode_graphs import DecodeBuffers, cuda_graph_capture
from local_engine.model.flashinfer_attention import WORKSPACE_BYTES
from local_engine.model.graph_step import GraphBackend


class FlashInferDecode:
    """A StaticAttention (local_engine.model.graph_step) by FlashInfer's batched decode kernel."""

    def __init__(self, device: torch.device, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 scaling: float) -> None:
        """`scaling`: the softmax scale of every layer (planned once per step; a layer asking for another raises
        ValueError when the step is captured)."""
        import flashinfer  # the package exists only where CUDA does

        self._flashinfer = flashinfer
        self.num_heads, self.num_kv_heads, self.head_dim, self.dtype = num_heads, num_kv_heads, head_dim, dtype
        self.scaling = scaling
        # One workspace for every size's wrapper: one step runs at a time, and each plans before it runs.
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrappers: dict[int, object] = {}

    def prepare(self, buffers: DecodeBuffers, inputs: dict[str, torch.Tensor]) -> None:
        wrapper = self._wrappers.get(buffers.size)
        if wrapper is None:
            wrapper = self._wrappers[buffers.size] = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=buffers.kv_indptr,
                paged_kv_indices_buffer=torch.empty_like(buffers.kv_indices),
                paged_kv_last_page_len_buffer=buffers.last_page_len,
            )
        wrapper.plan(
            inputs["kv_indptr"],
            buffers.kv_indices[: len(inputs["kv_indices"])],  # on the device: copied without a wait
            inputs["last_page_len"],
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            1,  # page size: one slot
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
            sm_scale=self.scaling,
        )

    def attend(self, buffers: DecodeBuffers, layer: int, queries: torch.Tensor, pool_k: torch.Tensor,
               pool_v: torch.Tensor, scaling: float) -> torch.Tensor:
        if scaling != self.scaling:
            raise ValueError(f"layer {layer} scales attention by {scaling}, the plan by {self.scaling}")
        pages = (pool_k.unsqueeze(1), pool_v.unsqueeze(1))  # [num_slots, page_size 1, num_kv_heads, head_dim]
        return self._wrappers[buffers.size].run(queries.to(self.dtype).contiguous(), pages)


def flashinfer_graph_backend(device: torch.device, num_heads: int, num_kv_heads: int, head_dim: int,
                             dtype: torch.dtype, scaling: float) -> GraphBackend:
    """FlashInferDecode in steps captured as CUDA graphs (`cuda_graph_capture`)."""
    return GraphBackend(FlashInferDecode(device, num_heads, num_kv_heads, head_dim, dtype, scaling),
                        cuda_graph_capture)
