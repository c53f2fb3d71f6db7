"""Decode kernels for x86-64 CPUs with AVX2 and FMA (local_engine/model/csrc, built by setup.py when a C
compiler is there): the matmul of a few rows against a weight, decode attention read straight from the paged pool's
slots, and a decoder layer's elementwise steps (RMSNorm, rotary embedding, SwiGLU), each one call where torch
dispatches several operations, all of a decode step's decoder layers in one call (`decode_layers`), and on CPUs with
AMX-BF16 a prefill chunk's attention over a bf16 pool (`chunk_attention`). Weights and the pool may be float32 or
bfloat16, read as stored and widened in registers; activations and arithmetic are float32 (but for chunk_attention's
bf16 products), so a bfloat16 model's decode step reads half the bytes and, up to `max_rows` rows (4, or 8 on the
512-bit path), rounds only its stored K/V.

A decode step at small batch sizes reads every weight once and each sequence's context once, so its time is set by
memory reads. On a 2-core AMD EPYC (AVX2, no AVX-512) whose read bandwidth a torch sum measures at 22.5 GB/s, MKL's
float32 GEMV read SmolLM2's 538 MB of weights (30 layers plus the 49152x576 head, one input row) at 11.4 GB/s and
oneDNN's packed GEMV at 16.8 GB/s; at 8 rows at 6.4 and 8.9 GB/s. `linear` here reads the weight's rows one after
another, one linear stream per thread on torch's own OpenMP threads, each row against up to 4 input rows at a time:
29-32 GB/s for one row (where the torch sum read 33 in the same run) and 17 GB/s for 8.

`available()` says whether they run here (local_engine.model.kernel_extension: built from the sources shipped, CPU
supports them, torch's OpenMP runtime found, not switched off), `unavailable_reason()` why not, `chunk_attends`
whether chunk_attention does; callers keep torch's kernels otherwise, and for any other dtype or device.
`path_counts()` and `paths_since()` say which paths ran.

Every kernel is a declared torch operator, `prefixscope::<name>` (local_engine.model.kernel_ops): its schema and
checks run before the C touches memory (ValueError naming what was passed), and the profiler shows it. Adding a
kernel is one declaration here:

    @kernel_op(mutates=("out",))
    def _scale_rows(x: torch.Tensor, factor: float, out: torch.Tensor) -> Launch:
        float_rows(x, "x")
        float_rows(out, "out", x.shape[1])
        expect(out.shape == x.shape, lambda: f"out {describe(out)} for x {describe(x)}")
        return lambda ext: ext.scale_rows(x.data_ptr(), factor, out.data_ptr(), x.shape[0], x.shape[1])

(schema types only; checks of shapes, dtypes, strides and devices; the launch calls the C entry point of
module.c; outputs are arguments it writes, named in `mutates`), plus a public function that allocates the outputs
and calls the op, as those below do.
"""

from __future__ import annotations

import threading

import torch

from local_engine.model import kernel_extension
from local_engine.model.decode_plan import DecodePlan, DecodeStep, plan_decode
from local_engine.model.decoder_kernels import DecoderLayers, decode_layers
from local_engine.model.kernel_extension import path_counts, paths_since, set_mode
from local_engine.model.kernel_ops import (STORED_DTYPES, Launch, describe, expect, float_rows, int64s, kernel_op,
                                            stored)

__all__ = ["DecodePlan", "DecodeStep", "DecoderLayers", "decode_layers", "plan_decode", "path_counts", "paths_since",
           "set_mode"]

MAX_ROWS = 16  # rows up to which `linear` beats torch's GEMM (on the EPYC above: 54 against 76 ms at 16, even at 32)
# On bfloat16 weights, widened in registers, up to 4 rows (one pass over the weight) read near memory speed on the AVX2
# path, more are bound by the widening and the FMAs: on a 2-core EPYC with AVX512-BF16, SmolLM2's 270 MB took 7.6-9.0 ms
# for 1-4 rows against 9.9-10.7 for oneDNN's packed bf16 GEMM (with the casts of input and output), 18.9-23.9 against
# 9.6-11.6 for 5-8 rows. The 512-bit path widens a line once for 8 rows: on a 2-core Xeon with AMX, 212 MB of weights
# took 12.4 ms for 8 rows against oneDNN's 12.1 (AMX), and a SmolLM2 decode step of 8 rows then runs in one
# `decode_layers` call (37.6-38.8 ms against 40.8-41.3 with oneDNN's matmuls between Python's operations). Not yet
# timed on the EPYC.
MAX_BF16_ROWS = 4
MAX_BF16_ROWS_WIDE = 8
_DTYPES = STORED_DTYPES


def _module():
    """The extension where the kernels run here and are not switched off, else None."""
    if kernel_extension.off_reason() is not None:
        return None
    return kernel_extension.extension()[0]


def available() -> bool:
    """Whether the kernels run here: built from the sources shipped, this CPU has AVX2 and FMA, torch's OpenMP
    runtime was bound, and they are not switched off (`PREFIXSCOPE_CPU_KERNELS=off`, `--cpu-kernels off`)."""
    return _module() is not None


def unavailable_reason() -> str | None:
    """Why `available()` is False (not built, a stale build, the CPU, switched off), or None when it is True."""
    return kernel_extension.off_reason() or kernel_extension.extension()[1]


def attends(pool_k: torch.Tensor) -> bool:
    """Whether `decode_attention` serves a pool layer like `pool_k` (`[num_slots, kv_heads, head_dim]`): float32 or
    bfloat16 on the CPU, a head_dim the kernel takes (a multiple of 8, at most 256), the kernels available."""
    head_dim = pool_k.shape[-1]
    return (pool_k.is_cpu and pool_k.dtype in _DTYPES and head_dim % 8 == 0 and head_dim <= 256
            and available())


def use_avx512(enabled: bool) -> bool:
    """Whether the kernels take their 512-bit paths (the bf16 matmul; decode attention for a KV head read by 8 or
    more queries, or fewer on a head_dim that is a multiple of 32) on a CPU with AVX-512F and BW, as they do by
    default; returns whether they now do (False where the kernels do not run). The AVX2 paths compute the same values
    within float32 rounding. `max_rows` follows it: steps already planned keep their sizes, which both paths serve.
    `chunk_attention`, on AMX, does not follow it."""
    module = kernel_extension.extension()[0]
    return module is not None and module.use_avx512(enabled)


def runs(weight: torch.Tensor) -> bool:
    """Whether `linear` serves this weight: float32 or bfloat16, contiguous, on the CPU, the kernels available."""
    return weight.is_cpu and weight.dtype in _DTYPES and weight.is_contiguous() and available()


def max_rows(weight: torch.Tensor) -> int:
    """How many input rows `linear` takes on `weight` (0 where it does not run): up to there a decode step multiplies
    on the kernels, and runs its decoder layers in one `decode_layers` call; more rows go to torch's GEMM."""
    if not runs(weight):
        return 0
    if weight.dtype == torch.bfloat16:
        return MAX_BF16_ROWS_WIDE if _module().avx512() else MAX_BF16_ROWS
    return MAX_ROWS


def _heads_apart(x: torch.Tensor, name: str) -> None:
    """Checks that `x` is float32 `[rows, heads, head_dim]` on the CPU whose heads lie head_dim apart in each row."""
    # A dimension of size 1 may have any stride (torch calls such a tensor contiguous): only the others are checked.
    rows, heads, head_dim = x.shape if x.dim() == 3 else (0, 0, 0)
    expect(x.dim() == 3 and x.dtype == torch.float32 and x.is_cpu and (head_dim < 2 or x.stride(2) == 1)
           and (heads < 2 or x.stride(1) == head_dim) and (rows < 2 or x.stride(0) >= heads * head_dim),
           lambda: f"{name}: float32 CPU [rows, heads, head_dim] with heads head_dim apart, got {describe(x)}")


@kernel_op(mutates=("out",))
def _linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> Launch:
    float_rows(x, "x")
    stored(weight, "weight", 2)
    rows, k, n = x.shape[0], x.shape[1], weight.shape[0]
    expect(weight.shape[1] == k, lambda: f"x has {k} features, the weight {weight.shape[1]}")
    float_rows(out, "out", n)
    expect(out.shape[0] == rows, lambda: f"out {describe(out)} for {rows} rows")
    bf16 = weight.dtype == torch.bfloat16
    return lambda ext: ext.linear(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, n, k, bf16,
                                  torch.get_num_threads())


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`x @ weight.T` for float32 `x` `[rows, in_features]` (rows <= `max_rows(weight)` to be faster than torch)
    and float32 or bfloat16 `weight` `[out_features, in_features]`, both contiguous on the CPU; returns float32
    `[rows, out_features]`, summed in float32 in another order than MKL or oneDNN: within float32 rounding of the
    exact products' sum, not bit for bit. Raises ValueError for other shapes, dtypes or devices."""
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    _linear(x, weight, out)
    return out


@kernel_op(mutates=("out",))
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> Launch:
    float_rows(x, "x")
    stored(weight, "weight", 1)
    rows, n = x.shape
    expect(weight.shape[0] == n, lambda: f"a norm weight {describe(weight)} for {n} features")
    float_rows(out, "out", n)
    expect(out.shape[0] == rows, lambda: f"out {describe(out)} for {rows} rows")
    bf16 = weight.dtype == torch.bfloat16
    return lambda ext: ext.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, n, eps, bf16)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm of float32 `x` `[rows, n]` with float32 or bfloat16 `weight` `[n]`, both
    contiguous on the CPU, computed in float32: `x * rsqrt(mean(x**2) + eps) * weight`, a new `[rows, n]` tensor.
    Raises ValueError for other shapes, dtypes or devices."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _rms_norm(x, weight, eps, out)
    return out


@kernel_op(mutates=("qkv",))
def _rotate(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> Launch:
    expect(qkv.dim() == 3 and qkv.dtype == torch.float32 and qkv.is_cpu and qkv.is_contiguous(),
           lambda: f"qkv: contiguous float32 CPU [rows, all_heads, head_dim], got {describe(qkv)}")
    rows, all_heads, head_dim = qkv.shape
    for name, x in (("cos", cos), ("sin", sin)):
        float_rows(x, name, head_dim)
        expect(x.shape[0] == rows, lambda: f"{name} {describe(x)} for {rows} rows")
    expect(0 <= heads <= all_heads and head_dim % 2 == 0,
           lambda: f"{heads} heads to rotate of qkv {describe(qkv)} (an even head_dim)")
    return lambda ext: ext.rotate(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), rows, all_heads * head_dim, heads,
                                  head_dim)


def rotate_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> None:
    """The rotary embedding of the first `heads` heads of float32 `qkv` `[rows, all_heads, head_dim]` (contiguous),
    in place: `x * cos + rotate_half(x) * sin` with `cos`, `sin` contiguous `[rows, head_dim]`. Raises ValueError
    for other shapes, dtypes or devices."""
    _rotate(qkv, cos, sin, heads)


@kernel_op(mutates=("out",))
def _silu_mul(gate_up: torch.Tensor, out: torch.Tensor) -> Launch:
    float_rows(gate_up, "gate_up")
    rows, n = gate_up.shape[0], gate_up.shape[1] // 2
    expect(gate_up.shape[1] % 2 == 0, lambda: f"gate_up {describe(gate_up)}: an odd width")
    float_rows(out, "out", n)
    expect(out.shape[0] == rows, lambda: f"out {describe(out)} for {rows} rows")
    return lambda ext: ext.silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, n)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for float32 `gate_up` `[rows, 2n]` (contiguous, gate first); returns `[rows, n]`. Raises
    ValueError for other shapes, dtypes or devices."""
    out = torch.empty(gate_up.shape[0], gate_up.shape[-1] // 2, dtype=torch.float32)
    _silu_mul(gate_up, out)
    return out


def _rows_of_heads(x: torch.Tensor) -> torch.Tensor:
    """`x` `[rows, heads, head_dim]` as float32 whose heads lie head_dim apart in each row (rows may lie further
    apart, as in a view of a step's qkv output): `x` itself when it is so, else a contiguous float32 copy."""
    if x.dtype == torch.float32 and x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.to(torch.float32).contiguous()


def _pool_pair(pool_k: torch.Tensor, pool_v: torch.Tensor, dim: int) -> None:
    stored(pool_k, "pool_k", dim)
    expect(pool_v.shape == pool_k.shape and pool_v.dtype == pool_k.dtype and pool_v.is_cpu
           and pool_v.is_contiguous(), lambda: f"pool_v {describe(pool_v)} beside pool_k {describe(pool_k)}")


def _plan(slots: torch.Tensor, segments: torch.Tensor, segment_rows: torch.Tensor, rows: int) -> None:
    int64s(slots, "plan slots", 2)
    int64s(segments, "plan segments", 2)
    int64s(segment_rows, "plan segment rows", 1)
    expect(slots.shape[0] == rows and segments.shape[1] == 5,
           lambda: f"a plan of {tuple(slots.shape)} slots and {tuple(segments.shape)} segments for {rows} rows")


@kernel_op(mutates=("out",))
def _decode_attention(query: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, slots: torch.Tensor,
                      segments: torch.Tensor, segment_rows: torch.Tensor, scale: float, out: torch.Tensor) -> Launch:
    _heads_apart(query, "query")
    _pool_pair(pool_k, pool_v, 3)
    rows, heads, head_dim = query.shape
    num_slots, kv_heads = pool_k.shape[0], pool_k.shape[1]
    expect(pool_k.shape[2] == head_dim and heads % kv_heads == 0 and head_dim % 8 == 0 and head_dim <= 256,
           lambda: f"query {describe(query)} cannot attend a pool layer {describe(pool_k)}")
    _plan(slots, segments, segment_rows, rows)
    expect(out.shape == query.shape and out.dtype == torch.float32 and out.is_contiguous(),
           lambda: f"out {describe(out)} for query {describe(query)}")
    bf16 = pool_k.dtype == torch.bfloat16
    return lambda ext: ext.decode_attention(
        query.data_ptr(), query.stride(0), pool_k.data_ptr(), pool_v.data_ptr(), num_slots, slots.data_ptr(),
        segments.data_ptr(), segment_rows.data_ptr(), segment_rows.shape[0], out.data_ptr(), rows, slots.shape[1],
        segments.shape[0], heads, kv_heads, head_dim, scale, bf16, torch.get_num_threads())


def decode_attention(query: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, plan: DecodePlan,
                     scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """One query token per row attends to its context as `plan` says.

    `query`: `[rows, heads, head_dim]`, computed in float32 (a view with rows further apart is read in place);
    `pool_k`, `pool_v`: one layer of the pool, float32 or bfloat16, contiguous `[num_slots, kv_heads, head_dim]` on
    the CPU. Writes into `out` (contiguous float32 `[rows, heads, head_dim]`; a new tensor when None) and returns it.
    Raises ValueError for a head_dim that is not a multiple of 8 or is above 256 and other shapes, dtypes or devices,
    IndexError for a plan that reads outside its rows, its tables or the pool.
    """
    query = _rows_of_heads(query)
    if out is None:
        out = torch.empty(query.shape, dtype=torch.float32)
    _decode_attention(query, pool_k, pool_v, plan.slots, plan.segments, plan.segment_rows, scale, out)
    return out


def chunk_attention_runs(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether `chunk_attention` serves a CPU pool of `dtype` and `head_dim`: bfloat16, a head_dim that is a multiple
    of 32 up to 128 (the kernel's CHUNK_HEAD_DIM_STEP and CHUNK_MAX_HEAD_DIM), on a CPU with AMX-BF16 (and AVX-512 F,
    BW, VL and BF16) whose kernel grants the tile state, the kernels available."""
    if dtype != torch.bfloat16 or not available():
        return False
    module = _module()
    return head_dim % module.CHUNK_HEAD_DIM_STEP == 0 and head_dim <= module.CHUNK_MAX_HEAD_DIM and module.amx()


def chunk_attends(pool_k: torch.Tensor) -> bool:
    """Whether `chunk_attention` serves a pool layer like `pool_k` (`[num_slots, kv_heads, head_dim]`)."""
    return pool_k.is_cpu and chunk_attention_runs(pool_k.dtype, pool_k.shape[-1])


_workspaces = threading.local()  # each thread's chunk_attention workspace, grown to the largest call so far


@kernel_op(mutates=("out",))
def _chunk_attention(query: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, slots: torch.Tensor,
                     scale: float, out: torch.Tensor) -> Launch:
    _heads_apart(query, "query")
    tokens, heads, head_dim = query.shape
    expect(pool_k.is_cpu and chunk_attends(pool_k) and pool_k.is_contiguous() and pool_k.dim() == 3
           and pool_k.shape[2] == head_dim, lambda: f"a pool layer {describe(pool_k)} chunk attention does not serve "
           f"for query {describe(query)}")
    _pool_pair(pool_k, pool_v, 3)
    int64s(slots, "slots", 1)
    expect(out.shape == query.shape and out.dtype == torch.float32 and out.is_cpu
           and out.stride(2) == 1 and out.stride(1) == head_dim and (tokens < 2 or out.stride(0) >= heads * head_dim),
           lambda: f"out {describe(out)}: float32 rows apart by at least heads * head_dim, for query {describe(query)}")
    context, kv_heads, num_slots = slots.shape[0], pool_k.shape[1], pool_k.shape[0]

    def launch(ext) -> None:
        threads = torch.get_num_threads()
        needed = ext.chunk_workspace(tokens, context, heads, kv_heads, head_dim, threads)
        workspace = getattr(_workspaces, "buffer", None)
        if workspace is None or workspace.numel() < needed:
            workspace = _workspaces.buffer = torch.empty(needed, dtype=torch.uint8)
        ext.chunk_attention(query.data_ptr(), query.stride(0), pool_k.data_ptr(), pool_v.data_ptr(), num_slots,
                            slots.data_ptr(), out.data_ptr(), out.stride(0), tokens, context, heads, kv_heads,
                            head_dim, scale, workspace.data_ptr(), workspace.numel(), threads)

    return launch


def chunk_attention(query: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, slots: torch.Tensor,
                    scale: float, out: torch.Tensor) -> None:
    """Causal attention of a prefill chunk over its whole context, on AMX (csrc/attention_amx.c).

    `query`: `[tokens, heads, head_dim]` computed in float32 (a view with rows further apart is read in place), the
    chunk's tokens, which are the last `tokens` of the context; `pool_k`, `pool_v`: one layer of a bfloat16 pool,
    contiguous `[num_slots, kv_heads, head_dim]`; `slots`: int64 `[context]`, the context's slots in order. Token i
    attends to the context's first `context - tokens + i + 1` keys. Writes float32 `[tokens, heads, head_dim]` into
    `out` (on the CPU, rows apart by at least heads * head_dim, heads head_dim apart). The queries and the
    probabilities are rounded to bfloat16 and every sum is float32, as torch's CPU flash attention computes on
    bfloat16 inputs (in another order). Each thread keeps a workspace of about twice one layer's context K/V, grown to
    the largest call. Raises IndexError for a slot outside the pool, ValueError for a pool `chunk_attends` refuses or
    tensors of other shapes, dtypes or devices.
    """
    expect(query.is_cpu and slots.is_cpu and out.is_cpu,
           lambda: "chunk_attention runs on CPU tensors")
    _chunk_attention(_rows_of_heads(query), pool_k, pool_v, slots.contiguous(), scale, out)


@kernel_op(mutates=("pool_layer",))
def _store(pool_layer: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> Launch:
    _heads_apart(rows, "rows")
    stored(pool_layer, "pool_layer", 3)
    int64s(slots, "slots", 1)
    expect(pool_layer.shape[1:] == rows.shape[1:] and slots.shape == rows.shape[:1],
           lambda: f"cannot store rows {describe(rows)} at slots {describe(slots)} into a pool layer "
           f"{describe(pool_layer)}")
    bf16 = pool_layer.dtype == torch.bfloat16
    return lambda ext: ext.store_rows(pool_layer.data_ptr(), pool_layer.shape[0], rows.data_ptr(), rows.stride(0),
                                      slots.data_ptr(), rows.shape[0], rows.shape[1] * rows.shape[2], bf16)


def store(pool_layer: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """`pool_layer[slots] = rows` for float32 `rows` `[n, kv_heads, head_dim]` (a view with tokens further apart is
    read in place) into a contiguous float32 or bfloat16 pool layer `[num_slots, kv_heads, head_dim]` on the CPU,
    rounding to bfloat16 as torch's `.to(torch.bfloat16)` does; `slots`: int64 `[n]`. Raises IndexError for a slot
    outside the pool and ValueError for mismatched tensors, writing nothing."""
    _store(pool_layer, slots.contiguous(), _rows_of_heads(rows))

