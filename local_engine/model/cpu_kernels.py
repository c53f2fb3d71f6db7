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

`available()` says whether they run here (built, CPU supports them, torch's OpenMP runtime found), and
`chunk_attends` whether chunk_attention does; callers keep torch's kernels otherwise, and for any other dtype or
device.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import torch

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
_SPLIT_TOKENS = 512  # contexts are attended in parts of at most about this many tokens, one part per thread at least


@functools.cache
def _module():
    try:
        from local_engine.model import _cpu_kernels
    except ImportError:
        return None
    if not _cpu_kernels.supported():
        return None
    try:  # the OpenMP runtime torch loaded, found among the process's mapped files
        with open("/proc/self/maps") as maps:
            runtimes = {line.split()[-1] for line in maps if "/libgomp" in line or "/libiomp" in line}
    except OSError:
        return None
    # torch's own copy first, should another package have loaded the system's libgomp beside it
    if not any(_cpu_kernels.bind_openmp(path) for path in sorted(runtimes, key=lambda path: "/torch/" not in path)):
        return None
    return _cpu_kernels


_DTYPES = (torch.float32, torch.bfloat16)  # how weights and the pool may be stored


def attends(pool_k: torch.Tensor) -> bool:
    """Whether `decode_attention` serves a pool layer like `pool_k` (`[num_slots, kv_heads, head_dim]`): float32 or
    bfloat16 on the CPU, a head_dim the kernel takes (a multiple of 8, at most 256), the kernels available."""
    head_dim = pool_k.shape[-1]
    return (pool_k.device.type == "cpu" and pool_k.dtype in _DTYPES and head_dim % 8 == 0 and head_dim <= 256
            and available())


def available() -> bool:
    """Whether the kernels are built, this CPU has AVX2 and FMA, and torch's OpenMP runtime was bound."""
    return _module() is not None


def use_avx512(enabled: bool) -> bool:
    """Whether the kernels take their 512-bit paths (the bf16 matmul; decode attention for a KV head read by 8 or
    more queries, or fewer on a head_dim that is a multiple of 32) on a CPU with AVX-512F and BW, as they do by
    default; returns whether they now do. The AVX2 paths compute the same values within float32 rounding. `max_rows`
    follows it: steps already planned keep their sizes, which both paths serve. `chunk_attention`, on AMX, does not
    follow it."""
    return _module().use_avx512(enabled)


def runs(weight: torch.Tensor) -> bool:
    """Whether `linear` serves this weight: float32 or bfloat16, contiguous, on the CPU, the kernels available."""
    return weight.device.type == "cpu" and weight.dtype in _DTYPES and weight.is_contiguous() and available()


def max_rows(weight: torch.Tensor) -> int:
    """How many input rows `linear` takes on `weight` (0 where it does not run): up to there a decode step multiplies
    on the kernels, and runs its decoder layers in one `decode_layers` call; more rows go to torch's GEMM."""
    if not runs(weight):
        return 0
    if weight.dtype == torch.bfloat16:
        return MAX_BF16_ROWS_WIDE if _module().avx512() else MAX_BF16_ROWS
    return MAX_ROWS


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`x @ weight.T` for float32 `x` `[rows, in_features]` (rows <= `max_rows(weight)`) and float32 or bfloat16
    `weight` `[out_features, in_features]`, both contiguous on the CPU; returns float32 `[rows, out_features]`,
    summed in float32 in another order than MKL or oneDNN: within float32 rounding of the exact products' sum, not
    bit for bit. Raises ValueError when the features differ."""
    rows, k = x.shape
    if k != weight.shape[1]:
        raise ValueError(f"x has {k} features, the weight {weight.shape[1]}")
    out = torch.empty(rows, weight.shape[0], dtype=torch.float32)
    _module().linear(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, weight.shape[0], k,
                     weight.dtype == torch.bfloat16, torch.get_num_threads())
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm of float32 `x` `[rows, n]` with float32 or bfloat16 `weight` `[n]`, both
    contiguous on the CPU, computed in float32: `x * rsqrt(mean(x**2) + eps) * weight`, a new `[rows, n]` tensor.
    Raises ValueError for a weight of another dtype."""
    if weight.dtype not in _DTYPES:
        raise ValueError(f"a {weight.dtype} norm weight")
    rows, n = x.shape
    out = torch.empty_like(x)
    _module().rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, n, eps, weight.dtype == torch.bfloat16)
    return out


def rotate_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> None:
    """The rotary embedding of the first `heads` heads of float32 `qkv` `[rows, all_heads, head_dim]` (contiguous),
    in place: `x * cos + rotate_half(x) * sin` with `cos`, `sin` contiguous `[rows, head_dim]`."""
    rows, all_heads, head_dim = qkv.shape
    _module().rotate(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), rows, all_heads * head_dim, heads, head_dim)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for float32 `gate_up` `[rows, 2n]` (contiguous, gate first); returns `[rows, n]`."""
    rows, both = gate_up.shape
    out = torch.empty(rows, both // 2, dtype=torch.float32)
    _module().silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, both // 2)
    return out


@dataclass(frozen=True)
class DecodePlan:
    """How one step's decode rows are attended by `decode_attention`, built once per step for every layer.

    `slots`: int64 `[rows, longest]`, each row's slot table padded with zeros; `segments`: int64
    `[num_segments, 5]`, each (row whose table is read, first position, end position, first index into
    `segment_rows`, number of rows), largest first; `segment_rows`: int64, the rows attending each segment."""

    slots: torch.Tensor
    segments: torch.Tensor
    segment_rows: torch.Tensor

    @property
    def rows(self) -> int:
        return self.slots.shape[0]


def plan_decode(tables: list[torch.Tensor], groups: list[tuple[list[int], int]],
                threads: int | None = None) -> DecodePlan:
    """A DecodePlan for rows whose slot tables are `tables` (int64 CPU `[n_i]`, ending with the row's new token):
    each of `groups` (`(rows, shared prefix length)`, as `find_shared_prefixes` returns) reads its shared prefix
    once for all its rows, in parts, and each of its rows reads the rest alone; a row in no group reads its table in
    parts. Parts are at most about _SPLIT_TOKENS long, and there are at least `threads` (default: torch's)."""
    threads = threads or torch.get_num_threads()
    lengths = [len(table) for table in tables]
    slots = torch.zeros(len(tables), max(lengths), dtype=torch.int64)
    for row, table in enumerate(tables):
        slots[row, : len(table)] = table
    grouped = {row for rows, _ in groups for row in rows}
    spans = [([row], row, 0, lengths[row]) for row in range(len(tables)) if row not in grouped]
    for rows, shared in groups:
        spans.append((rows, rows[0], 0, shared))
        spans.extend(([row], row, shared, lengths[row]) for row in rows)
    tokens = sum(end - start for _, _, start, end in spans)
    part = max(1, min(_SPLIT_TOKENS, tokens // threads))
    segments, segment_rows = [], []
    for rows, table_row, start, end in spans:
        parts = max(1, -(-(end - start) // part))
        for index in range(parts):
            first, last = start + (end - start) * index // parts, start + (end - start) * (index + 1) // parts
            segments.append(((last - first) * (2 + len(rows)), [table_row, first, last, len(segment_rows), len(rows)]))
            segment_rows.extend(rows)
    segments.sort(key=lambda segment: -segment[0])
    return DecodePlan(slots, torch.tensor([fields for _, fields in segments], dtype=torch.int64),
                      torch.tensor(segment_rows, dtype=torch.int64))


def _rows_of_heads(x: torch.Tensor) -> torch.Tensor:
    """`x` `[rows, heads, head_dim]` as float32 whose heads lie head_dim apart in each row (rows may lie further
    apart, as in a view of a step's qkv output): `x` itself when it is so, else a contiguous float32 copy."""
    if x.dtype == torch.float32 and x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.to(torch.float32).contiguous()


def decode_attention(query: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, plan: DecodePlan,
                     scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """One query token per row attends to its context as `plan` says.

    `query`: `[rows, heads, head_dim]`, computed in float32 (a view with rows further apart is read in place);
    `pool_k`, `pool_v`: one layer of the pool, float32 or bfloat16, contiguous `[num_slots, kv_heads, head_dim]` on
    the CPU. Writes into `out` (contiguous float32 `[rows, heads, head_dim]`; a new tensor when None) and returns it.
    Raises ValueError for a head_dim that is not a multiple of 8 or is above 256.
    """
    query = _rows_of_heads(query)
    rows, heads, head_dim = query.shape
    if out is None:
        out = torch.empty(rows, heads, head_dim, dtype=torch.float32)
    _module().decode_attention(query.data_ptr(), query.stride(0), pool_k.data_ptr(), pool_v.data_ptr(),
                               plan.slots.data_ptr(), plan.segments.data_ptr(), plan.segment_rows.data_ptr(),
                               out.data_ptr(), rows, plan.slots.shape[1], len(plan.segments), heads, pool_k.shape[1],
                               head_dim, scale, pool_k.dtype == torch.bfloat16, torch.get_num_threads())
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
    return pool_k.device.type == "cpu" and chunk_attention_runs(pool_k.dtype, pool_k.shape[-1])


_workspaces = threading.local()  # each thread's chunk_attention workspace, grown to the largest call so far


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
    if query.device.type != "cpu" or slots.device.type != "cpu" or out.device.type != "cpu":
        raise ValueError("chunk_attention runs on CPU tensors")
    query = _rows_of_heads(query)
    tokens, heads, head_dim = query.shape
    context, kv_heads = slots.shape[0], pool_k.shape[1]
    if (not chunk_attends(pool_k) or pool_v.shape != pool_k.shape or pool_k.shape[2] != head_dim
            or pool_v.dtype != pool_k.dtype or pool_v.device != pool_k.device
            or not (pool_k.is_contiguous() and pool_v.is_contiguous()) or slots.dtype != torch.int64
            or slots.dim() != 1 or out.shape != query.shape or out.dtype != torch.float32 or out.stride(2) != 1
            or out.stride(1) != head_dim or out.stride(0) < heads * head_dim):
        raise ValueError(f"a chunk of queries {tuple(query.shape)} cannot attend a pool layer {tuple(pool_k.shape)} "
                         f"({pool_k.dtype}) at slots {tuple(slots.shape)} ({slots.dtype}) into {tuple(out.shape)}")
    slots = slots.contiguous()
    threads = torch.get_num_threads()
    module = _module()
    needed = module.chunk_workspace(tokens, context, heads, kv_heads, head_dim, threads)
    workspace = getattr(_workspaces, "buffer", None)
    if workspace is None or workspace.numel() < needed:
        workspace = _workspaces.buffer = torch.empty(needed, dtype=torch.uint8)
    module.chunk_attention(query.data_ptr(), query.stride(0), pool_k.data_ptr(), pool_v.data_ptr(), pool_k.shape[0],
                           slots.data_ptr(), out.data_ptr(), out.stride(0), tokens, context, heads, kv_heads,
                           head_dim, scale, workspace.data_ptr(), workspace.numel(), threads)


def store(pool_layer: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """`pool_layer[slots] = rows` for float32 `rows` `[n, kv_heads, head_dim]` (a view with tokens further apart is
    read in place) into a contiguous float32 or bfloat16 pool layer `[num_slots, kv_heads, head_dim]` on the CPU,
    rounding to bfloat16 as torch's `.to(torch.bfloat16)` does; `slots`: int64 `[n]`. Raises IndexError for a slot
    outside the pool and ValueError for mismatched tensors, writing nothing."""
    rows = _rows_of_heads(rows)
    if (pool_layer.dtype not in _DTYPES or not pool_layer.is_contiguous() or pool_layer.shape[1:] != rows.shape[1:]
            or slots.dtype != torch.int64 or slots.shape != rows.shape[:1]):
        raise ValueError(f"cannot store rows {tuple(rows.shape)} at slots {tuple(slots.shape)} ({slots.dtype}) "
                         f"into a pool layer {tuple(pool_layer.shape)} ({pool_layer.dtype})")
    slots = slots.contiguous()
    _module().store_rows(pool_layer.data_ptr(), pool_layer.shape[0], rows.data_ptr(), rows.stride(0),
                         slots.data_ptr(), rows.shape[0], rows.shape[1] * rows.shape[2],
                         pool_layer.dtype == torch.bfloat16)


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
        attention scale; None where the kernels cannot run them (not all contiguous on the CPU in one float32 or
        bfloat16 dtype, shapes other than the above, layers of different epsilons or scales, or an attention shape
        `decode_attention` does not take)."""
        tensors = tuple(tensor for layer in layers for tensor in layer)
        if not layers or kv_heads < 1 or heads % kv_heads or head_dim % 8 or head_dim > 256:
            return None
        dtype = tensors[0].dtype
        if not all(runs(tensor) and tensor.dtype == dtype for tensor in tensors):
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
                   max_rows(layers[0][2]))


@dataclass(frozen=True)
class DecodeStep:
    """A step whose every row is one decode token attended by `decode_attention`: its `plan`, the pool slot of each
    row's new K/V (`write_slots`, int64 `[rows]`) and the whole pool (`pool_k`, `pool_v`: contiguous
    `[num_layers, num_slots, kv_heads, head_dim]`)."""

    plan: DecodePlan
    write_slots: torch.Tensor
    pool_k: torch.Tensor
    pool_v: torch.Tensor


def decode_layers(hidden: torch.Tensor, layers: DecoderLayers, step: DecodeStep, cos: torch.Tensor,
                  sin: torch.Tensor) -> None:
    """Runs a decode step through every decoder layer, in place on the residual stream `hidden` (contiguous float32
    `[rows, hidden]`), as local_engine.model.fused_llama's layers compute it on these kernels: per layer RMSNorm,
    the qkv matmul, the rotary embedding by `cos`, `sin` (contiguous float32 `[rows, head_dim]`), the new K/V
    stored at `step.write_slots`, decode attention, o_proj added to the residual, RMSNorm, gate_up, silu(gate) * up,
    down_proj added to the residual. Raises IndexError for a write slot outside the pool and ValueError for inputs
    of other shapes, dtypes or devices, a pool that does not match the layers or more rows than `layers.max_rows`,
    in each case writing nothing; MemoryError before anything is written."""
    pool_k, pool_v, plan = step.pool_k, step.pool_v, step.plan
    num_layers, num_slots = pool_k.shape[0], pool_k.shape[1]
    if (pool_k.shape != pool_v.shape or pool_k.shape[2:] != (layers.kv_heads, layers.head_dim)
            or num_layers < len(layers.table) or pool_k.dtype not in _DTYPES or pool_v.dtype != pool_k.dtype
            or pool_k.device.type != "cpu" or pool_v.device.type != "cpu"
            or not (pool_k.is_contiguous() and pool_v.is_contiguous())):
        raise ValueError(f"a pool {tuple(pool_k.shape)} ({pool_k.dtype}) does not match the decoder layers")
    rows = hidden.shape[0]
    float_rows = (hidden, cos, sin)
    if (hidden.dim() != 2 or hidden.shape[1] != layers.hidden or rows > layers.max_rows
            or any(x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous() for x in float_rows)
            or cos.shape != (rows, layers.head_dim) or sin.shape != cos.shape
            or step.write_slots.shape != (rows,) or step.write_slots.dtype != torch.int64 or plan.rows != rows):
        raise ValueError(f"hidden {tuple(hidden.shape)}, cos and sin {tuple(cos.shape)}, write slots "
                         f"{tuple(step.write_slots.shape)} ({step.write_slots.dtype}) and a plan of {plan.rows} rows "
                         f"do not make a step of layers of {layers.hidden} features (at most {layers.max_rows} rows)")
    write_slots = step.write_slots.contiguous()
    _module().decode_layers(
        hidden.data_ptr(), layers.table.data_ptr(), len(layers.table), pool_k.data_ptr(), pool_v.data_ptr(),
        pool_k[0].numel(), num_slots, cos.data_ptr(), sin.data_ptr(), write_slots.data_ptr(), plan.slots.data_ptr(),
        plan.segments.data_ptr(), plan.segment_rows.data_ptr(), plan.slots.shape[1], len(plan.segments), rows,
        layers.hidden, layers.heads, layers.kv_heads, layers.head_dim, layers.intermediate, layers.eps, layers.scale,
        layers.dtype == torch.bfloat16, pool_k.dtype == torch.bfloat16, torch.get_num_threads())
