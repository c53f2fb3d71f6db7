"""Which attention implementation reads the KV pool: the torch path (any device) or FlashInfer's paged kernels (CUDA).

`torch` gathers each sequence's slots and calls scaled-dot-product attention (local_engine.model.paged_attention),
with shared-prefix decode groups read once (local_engine.model.cascade_attention); it is the only path on the CPU.
`flashinfer` runs one batched paged-attention kernel per layer over the whole packed step (flashinfer-python,
`BatchPrefillWithPagedKVCacheWrapper`, as vLLM and SGLang use it), reading K/V straight from the pool: the pool's
`[num_slots, num_kv_heads, head_dim]` layer tensors are FlashInfer's "NHD" paged layout with a page of one slot.
`auto` picks FlashInfer on CUDA when the package is installed, the torch path otherwise.
"""

from __future__ import annotations

import importlib.util

import torch

ATTENTION_BACKENDS = ("auto", "torch", "flashinfer")


def flashinfer_installed() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def resolve_attention_backend(name: str, device: torch.device) -> str:
    """`torch` or `flashinfer` for `name` (one of ATTENTION_BACKENDS) on `device`.

    Raises ValueError for an unknown name, or for `flashinfer` asked for on a non-CUDA device or without the
    package installed (FlashInfer's kernels are CUDA-only).
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {list(ATTENTION_BACKENDS)}")
    if name == "auto":
        return "flashinfer" if device.type == "cuda" and flashinfer_installed() else "torch"
    if name == "flashinfer":
        if device.type != "cuda":
            raise ValueError("--attention-backend flashinfer needs a CUDA device (FlashInfer's kernels are CUDA-only)")
        if not flashinfer_installed():
            raise ValueError("--attention-backend flashinfer needs the flashinfer-python package installed")
    return name
