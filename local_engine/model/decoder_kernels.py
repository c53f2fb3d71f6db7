"""A decode step through every decoder layer in one CPU kernel call (csrc/decoder.c), with no return to Python
between layers: the model's layers as the kernel reads them (`DecoderLayers`, built once per model) and the call
(`decode_layers`, the op `prefixscope::decode_layers`). Both are re-exported by local_engine.model.cpu_kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from local_engine.model.decode_plan import DecodeStep
from local_engine.model.kernel_ops import Launch, describe, expect, float_rows, int64s, kernel_op, stored

FIELDS = 6  # a layer's tensors in the table, in decoder.c's order


@dataclass(frozen=True)
class DecoderLayers:
    """A Llama-architecture model's decoder layers as `decode_layers` reads them, built once per model.

    `table`: int64 `[num_layers, 6]`, each layer's tensor addresses (input RMSNorm weight, post-attention RMSNorm
    weight, fused qkv `[(heads + 2 * kv_heads) * head_dim, hidden]`, o `[hidden, heads * head_dim]`, fused gate_up
    `[2 * intermediate, hidden]`, down `[hidden, intermediate]`), all contiguous in `dtype`; `tensors` keeps them
    alive. `max_rows`: the most rows a step may have (`max_rows` of the weights)."""

    table: torch.Tensor
    tensors: tuple[torch.Tensor, ...]
    dtype: torch.dtype
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    scale: float
    max_rows: int

    @classmethod
    def of(cls, layers: list[tuple[torch.Tensor, ...]], heads: int, kv_heads: int, head_dim: int,
           eps: list[float], scale: list[float]) -> DecoderLayers | None:
        """From each layer's (input_norm, post_norm, qkv, o, gate_up, down) weights and its RMSNorm epsilon and
        attention scale; None where the kernels cannot run them (not available, not all contiguous on the CPU in one
        float32 or bfloat16 dtype, shapes other than the above, layers of different epsilons or scales, or an
        attention shape `decode_attention` does not take). The table's addresses are trusted by the op from here."""
        from local_engine.model import cpu_kernels  # which re-exports this module

        tensors = tuple(tensor for layer in layers for tensor in layer)
        if not layers or kv_heads < 1 or heads % kv_heads or head_dim % 8 or head_dim > 256:
            return None
        dtype = tensors[0].dtype
        if not all(cpu_kernels.runs(tensor) and tensor.dtype == dtype for tensor in tensors):
            return None
        if len(set(eps)) != 1 or len(set(scale)) != 1:
            return None
        hidden, intermediate = layers[0][5].shape
        shapes = ((hidden,), (hidden,), ((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim),
                  (2 * intermediate, hidden), (hidden, intermediate))
        if any(tuple(tensor.shape) != shape for layer in layers for tensor, shape in zip(layer, shapes, strict=True)):
            return None
        table = torch.tensor([[tensor.data_ptr() for tensor in layer] for layer in layers], dtype=torch.int64)
        return cls(table, tensors, dtype, hidden, heads, kv_heads, head_dim, intermediate, eps[0], scale[0],
                   cpu_kernels.max_rows(layers[0][2]))


@kernel_op(mutates=("hidden", "pool_k", "pool_v"))
def _decode_layers(hidden: torch.Tensor, table: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, write_slots: torch.Tensor, slots: torch.Tensor,
                   segments: torch.Tensor, segment_rows: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
                   intermediate: int, eps: float, scale: float, weights_bf16: bool, max_rows: int) -> Launch:
    float_rows(hidden, "hidden")
    rows, hidden_size = hidden.shape
    expect(rows <= max_rows, lambda: f"{rows} rows, the layers take at most {max_rows}")
    int64s(table, "table", 2)
    stored(pool_k, "pool_k", 4)
    num_layers, num_slots = pool_k.shape[0], pool_k.shape[1]
    expect(pool_v.shape == pool_k.shape and pool_v.dtype == pool_k.dtype and pool_v.is_cpu
           and pool_v.is_contiguous() and pool_k.shape[2:] == (kv_heads, head_dim) and table.shape[1] == FIELDS
           and table.shape[0] <= num_layers,
           lambda: f"a pool {describe(pool_k)} and {describe(pool_v)} does not match {table.shape[0]} decoder layers "
           f"of {kv_heads} KV heads of {head_dim}")
    for name, x in (("cos", cos), ("sin", sin)):
        float_rows(x, name, head_dim)
        expect(x.shape[0] == rows, lambda: f"{name} {describe(x)} for {rows} rows")
    int64s(write_slots, "write_slots", 1)
    int64s(slots, "plan slots", 2)
    int64s(segments, "plan segments", 2)
    int64s(segment_rows, "plan segment rows", 1)
    expect(write_slots.shape[0] == rows and slots.shape[0] == rows and segments.shape[1] == 5,
           lambda: f"write slots {describe(write_slots)} and a plan of {tuple(slots.shape)} slots and "
           f"{tuple(segments.shape)} segments for {rows} rows")
    pool_bf16 = pool_k.dtype == torch.bfloat16
    return lambda ext: ext.decode_layers(
        hidden.data_ptr(), table.data_ptr(), table.shape[0], pool_k.data_ptr(), pool_v.data_ptr(), pool_k[0].numel(),
        num_slots, cos.data_ptr(), sin.data_ptr(), write_slots.data_ptr(), slots.data_ptr(), segments.data_ptr(),
        segment_rows.data_ptr(), segment_rows.shape[0], slots.shape[1], segments.shape[0], rows, hidden_size, heads,
        kv_heads, head_dim, intermediate, eps, scale, weights_bf16, pool_bf16, torch.get_num_threads())


def decode_layers(hidden: torch.Tensor, layers: DecoderLayers, step: DecodeStep, cos: torch.Tensor,
                  sin: torch.Tensor) -> None:
    """Runs a decode step through every decoder layer, in place on the residual stream `hidden` (contiguous float32
    `[rows, hidden]`), as local_engine.model.fused_llama's layers compute it on these kernels: per layer RMSNorm,
    the qkv matmul, the rotary embedding by `cos`, `sin` (contiguous float32 `[rows, head_dim]`), the new K/V
    stored at `step.write_slots`, decode attention, o_proj added to the residual, RMSNorm, gate_up, silu(gate) * up,
    down_proj added to the residual. Raises IndexError for a write slot outside the pool or a plan that reads outside
    its rows, tables or the pool, and ValueError for inputs of other shapes, dtypes or devices, a pool that does not
    match the layers or more rows than `layers.max_rows`, in each case writing nothing; MemoryError before anything is
    written."""
    expect(hidden.dim() == 2 and hidden.shape[1] == layers.hidden,
           lambda: f"hidden {describe(hidden)} for layers of {layers.hidden} features")
    plan = step.plan
    _decode_layers(hidden, layers.table, step.pool_k, step.pool_v, cos, sin, step.write_slots.contiguous(),
                   plan.slots, plan.segments, plan.segment_rows, layers.heads, layers.kv_heads, layers.head_dim,
                   layers.intermediate, layers.eps, layers.scale, layers.dtype == torch.bfloat16, layers.max_rows)
