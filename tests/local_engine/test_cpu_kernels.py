"""The CPU decode kernels compute what torch computes, on float32 or bfloat16 weights and pools: the few-row matmul,
and decode attention from the paged pool for rows alone, rows sharing a prefix and rows of scattered slots, beside
prefill chunks."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from local_engine.cache.kv_pool import KVPool, KVPoolConfig
from local_engine.model import cpu_kernels
from local_engine.model.cascade_attention import find_shared_prefixes
from local_engine.model.paged_attention import build_paged_batch, paged_attention

from .test_cascade_attention import HEAD_DIM, NUM_HEADS, NUM_KV_HEADS, SCALING, mixed_tables


def _cpu_has(*flags: str) -> bool:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            line = next(line for line in cpuinfo if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return set(flags) <= set(line.split())


def test_the_kernels_run_in_ci_on_a_cpu_that_has_them():
    """`make install` builds them; a build that silently failed would leave every decode step on torch."""
    if os.environ.get("CI") != "true" or not _cpu_has("avx2", "fma"):
        pytest.skip("only checked in CI on an AVX2 CPU")
    assert cpu_kernels.available()
    bf16_pool = torch.zeros(1, NUM_KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)  # AMX only where the CPU has it
    assert not cpu_kernels.chunk_attends(bf16_pool) or _cpu_has("amx_bf16", "amx_tile", "avx512_bf16", "avx512vl")


needs_kernels = pytest.mark.skipif(not cpu_kernels.available(), reason="the CPU kernels are not built or this CPU "
                                   "lacks AVX2 and FMA")


@pytest.fixture(params=["avx512", "avx2"])
def vectors(request):
    """The kernels' 512-bit paths (the bf16 matmul; decode attention for a KV head read by 8 or more queries, or
    fewer on a head_dim that is a multiple of 32; on a CPU with AVX-512F and BW), then their AVX2 paths for the same
    inputs."""
    if request.param == "avx512" and not cpu_kernels.use_avx512(True):
        pytest.skip("this CPU has no AVX-512F and BW")
    cpu_kernels.use_avx512(request.param == "avx512")
    yield request.param
    cpu_kernels.use_avx512(True)


@needs_kernels
def test_a_bf16_weight_takes_8_rows_on_the_512_bit_path_and_4_on_avx2(vectors):
    weight = torch.zeros(4, 64, dtype=torch.bfloat16)
    wide = cpu_kernels.MAX_BF16_ROWS_WIDE if vectors == "avx512" else cpu_kernels.MAX_BF16_ROWS
    assert cpu_kernels.max_rows(weight) == wide and cpu_kernels.max_rows(weight.float()) == cpu_kernels.MAX_ROWS


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 12, cpu_kernels.MAX_ROWS])
@pytest.mark.parametrize(("out_features", "in_features"), [(960, 576), (577, 1536), (7, 13), (49, 40), (33, 100),
                                                           (5, 32)])
def test_linear_equals_a_float64_matmul_within_float32_rounding(rows, out_features, in_features, dtype, vectors):
    """Whole 64-byte lines of a bf16 weight in pairs and alone, and the elements past them, on both paths; rows in
    tiles of 4 and 8, whole and in part."""
    generator = torch.Generator().manual_seed(rows * 1000 + in_features)
    weight = torch.randn(out_features, in_features, generator=generator).to(dtype)  # bf16: its values, exactly
    x = torch.randn(rows, in_features, generator=generator)
    exact = x.double() @ weight.double().T
    got = cpu_kernels.linear(x, weight)
    assert got.shape == (rows, out_features) and got.dtype == torch.float32
    torch_error = (F.linear(x, weight.float()).double() - exact).abs().max().item()
    assert (got.double() - exact).abs().max().item() <= 4 * torch_error + 1e-6


def _pool(seed: int, slots: int = 1000, dtype: torch.dtype = torch.float32) -> KVPool:
    torch.manual_seed(seed)
    pool = KVPool(KVPoolConfig(1, NUM_KV_HEADS, HEAD_DIM, dtype, torch.device("cpu")), slots)
    pool.k.normal_()
    pool.v.normal_()
    return pool


def _alone(pool: KVPool, query: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """One row's attention over its table in float64: `[num_heads, head_dim]`."""
    keys = pool.k[0][table].double().transpose(0, 1).unsqueeze(0)
    values = pool.v[0][table].double().transpose(0, 1).unsqueeze(0)
    return F.scaled_dot_product_attention(query.double().unsqueeze(0).unsqueeze(2), keys, values, scale=SCALING,
                                          enable_gqa=True)[0, :, 0]


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_rows_of_every_kind_attend_as_each_alone_and_prefill_chunks_are_unchanged(monkeypatch, dtype,
                                                                                         vectors):
    tables, counts = mixed_tables()  # two groups, a row alone, a short shared opening, scattered slots, a prefill
    pool = _pool(0, dtype=dtype)  # bf16: read as stored, the arithmetic in float32
    total = sum(counts)
    query = torch.randn(1, NUM_HEADS, total, HEAD_DIM)
    key, value = torch.randn(2, 1, NUM_KV_HEADS, total, HEAD_DIM)
    batch = build_paged_batch(pool, tables, counts, 8)
    assert batch.decode_plan is not None and batch.cascade is None and batch.decode_slots is None
    out = paged_attention(batch, 0, query, key, value, SCALING)[0]
    for row, table in enumerate(tables[:8]):  # the pool already holds the step's new K/V
        assert (out[row].double() - _alone(pool, query[0, :, row], table)).abs().max() <= 1e-5
    if cpu_kernels.chunk_attends(pool.k[0]):  # the prefill chunk: on AMX in bf16, else torch's SDPA
        exact = _chunk_exact(query[0].transpose(0, 1)[8:], pool.k[0], pool.v[0], tables[8], SCALING)
        assert (out[8:].double() - exact).abs().max() <= _chunk_tolerance(pool.v[0])
    else:
        monkeypatch.setattr(cpu_kernels, "available", lambda: False)
        torch_out = paged_attention(build_paged_batch(pool, tables, counts, 8), 0, query, key, value, SCALING)[0]
        assert torch.equal(out[8:], torch_out[8:])


@needs_kernels
def test_a_group_reads_its_shared_prefix_once_in_parts_and_each_row_its_suffix(vectors):
    prefix = torch.arange(1700)
    tables = [torch.cat([prefix, torch.arange(2000 + 50 * i, 2000 + 50 * i + 1 + i)]) for i in range(6)]
    tables.append(torch.arange(2400, 2400 + 1000))  # a row alone
    groups = find_shared_prefixes(tables, 64)
    assert groups == [([0, 1, 2, 3, 4, 5], 1700)]
    plan = cpu_kernels.plan_decode(tables, groups, threads=2)
    segments = plan.segments.tolist()
    shared = [s for s in segments if s[4] == 6]
    assert [s[1:3] for s in sorted(shared)] == [[0, 425], [425, 850], [850, 1275], [1275, 1700]]
    suffixes = sorted((s[0], s[1], s[2]) for s in segments if s[4] == 1 and s[0] < 6)
    assert suffixes == [(row, 1700, 1701 + row) for row in range(6)]
    alone = sorted(s[1:3] for s in segments if s[0] == 6)
    assert alone[0][0] == 0 and alone[-1][1] == 1000 and len(alone) == 2
    sizes = [(s[2] - s[1]) * (2 + s[4]) for s in segments]
    assert sizes == sorted(sizes, reverse=True)  # largest first, for the threads' shared counter
    pool = _pool(1, 3500)
    query = torch.randn(len(tables), NUM_HEADS, HEAD_DIM)
    out = cpu_kernels.decode_attention(query, pool.k[0], pool.v[0], plan, SCALING)
    for row, table in enumerate(tables):
        assert (out[row].double() - _alone(pool, query[row], table)).abs().max() <= 1e-5


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_more_queries_on_one_kv_head_than_one_pass_takes(dtype, vectors):
    """13 rows on one prefix: 39 queries per KV head, more than the 512-bit path's 32 at a time."""
    tables = [torch.cat([torch.arange(300), torch.arange(400 + 10 * row, 400 + 10 * row + 1 + row % 4)])
              for row in range(13)]
    plan = cpu_kernels.plan_decode(tables, find_shared_prefixes(tables, 64), threads=2)
    pool = _pool(5, 600, dtype)
    query = torch.randn(len(tables), NUM_HEADS, HEAD_DIM) * 2
    out = cpu_kernels.decode_attention(query, pool.k[0], pool.v[0], plan, SCALING)
    for row, table in enumerate(tables):
        assert (out[row].double() - _alone(pool, query[row], table)).abs().max() <= 1e-5


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("head_dim", "heads", "kv_heads", "rows"), [(64, 9, 3, 1), (32, 4, 4, 1), (96, 6, 2, 2),
                                                                     (128, 7, 1, 1), (64, 8, 4, 3)])
def test_a_few_queries_per_kv_head_attend_at_any_head_width_and_context_length(dtype, head_dim, heads, kv_heads,
                                                                               rows, vectors):
    """1 to 7 queries per KV head (one row's GQA group, or a few rows sharing a prefix): contexts that end inside a
    block of keys, a block's first key alone, head widths of 32 x an odd number."""
    generator = torch.Generator().manual_seed(head_dim + rows)
    config = KVPoolConfig(1, kv_heads, head_dim, dtype, torch.device("cpu"))
    pool = KVPool(config, 1200)
    pool.k.copy_(torch.randn(pool.k.shape, generator=generator))
    pool.v.copy_(torch.randn(pool.v.shape, generator=generator))
    for length in (1, 15, 16, 65, 130, 700):
        prefix = torch.randperm(1000, generator=generator)[:length]
        tables = [torch.cat([prefix, torch.tensor([1000 + row])]) for row in range(rows)]
        groups = find_shared_prefixes(tables, 1) if rows > 1 else []
        plan = cpu_kernels.plan_decode(tables, groups, threads=2)
        query = torch.randn(rows, heads, head_dim, generator=generator) * 3
        out = cpu_kernels.decode_attention(query, pool.k[0], pool.v[0], plan, head_dim ** -0.5)
        for row, table in enumerate(tables):
            keys = pool.k[0][table].double().transpose(0, 1).unsqueeze(0)
            values = pool.v[0][table].double().transpose(0, 1).unsqueeze(0)
            expected = F.scaled_dot_product_attention(query[row].double().unsqueeze(0).unsqueeze(2), keys, values,
                                                      scale=head_dim ** -0.5, enable_gqa=True)[0, :, 0]
            assert (out[row].double() - expected).abs().max() <= 1e-5, (length, row)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 4])  # 3 and 12 queries per KV head
def test_a_nan_in_a_key_reaches_the_output_of_the_heads_that_read_it(dtype, rows, vectors):
    pool = _pool(7, 300, dtype)
    pool.k[0][40, 1] = float("nan")  # KV head 1 of slot 40
    prefix = torch.arange(100)
    tables = [torch.cat([prefix, torch.tensor([200 + row])]) for row in range(rows)]
    plan = cpu_kernels.plan_decode(tables, find_shared_prefixes(tables, 64) if rows > 1 else [], threads=2)
    out = cpu_kernels.decode_attention(torch.randn(rows, NUM_HEADS, HEAD_DIM), pool.k[0], pool.v[0], plan, SCALING)
    group = NUM_HEADS // NUM_KV_HEADS
    assert out[:, group : 2 * group].isnan().all()
    assert not out[:, :group].isnan().any() and not out[:, 2 * group :].isnan().any()


@needs_kernels
@pytest.mark.parametrize(("threads", "dtype"), [(1, torch.float32), (2, torch.float32), (3, torch.bfloat16)])
def test_a_row_alone_is_split_for_the_threads_and_merged_exactly(threads, dtype):
    pool = _pool(2, 4000, dtype)
    table = torch.randperm(4000)[:3001]
    query = torch.randn(1, NUM_HEADS, HEAD_DIM) * 4  # sharp scores: a wrong merge of the parts' maxima shows
    plan = cpu_kernels.plan_decode([table], [], threads=threads)
    assert len(plan.segments) >= max(threads, 3001 // 512)
    out = cpu_kernels.decode_attention(query, pool.k[0], pool.v[0], plan, SCALING)
    assert (out[0].double() - _alone(pool, query[0], table)).abs().max() <= 1e-5


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_the_elementwise_steps_equal_transformers_forms(rows):
    generator = torch.Generator().manual_seed(rows)
    x, weight = torch.randn(rows, 581, generator=generator) * 3, torch.randn(581, generator=generator)
    expected = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.allclose(cpu_kernels.rms_norm(x, weight, 1e-5), expected, rtol=1e-5, atol=1e-5)
    rounded = weight.to(torch.bfloat16)  # a bf16 model's norm weight: read as stored
    assert torch.allclose(cpu_kernels.rms_norm(x, rounded, 1e-5), expected / weight * rounded.float(), rtol=1e-5,
                          atol=1e-5)
    gate_up = torch.randn(rows, 2 * 99, generator=generator) * 8  # large gates: exp's range ends
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.allclose(cpu_kernels.silu_mul(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-5)
    qkv = torch.randn(rows, 5, 72, generator=generator)
    angles = torch.rand(rows, 36, generator=generator) * 50
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)
    first, second = qkv[..., :36], qkv[..., 36:]
    rotated = qkv * cos.unsqueeze(1) + torch.cat([-second, first], dim=-1) * sin.unsqueeze(1)
    expected = torch.cat([rotated[:, :3], qkv[:, 3:]], dim=1)  # heads past the first 3 (v) untouched
    cpu_kernels.rotate_(qkv, cos, sin, 3)
    assert torch.allclose(qkv, expected, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_mismatched_inputs_are_refused_or_converted_not_read_past():
    with pytest.raises(ValueError):
        cpu_kernels.linear(torch.randn(2, 31), torch.randn(8, 32))
    pool = _pool(3)
    table = torch.arange(40)
    query = torch.randn(1, NUM_HEADS, HEAD_DIM).to(torch.bfloat16)  # computed in float32
    out = cpu_kernels.decode_attention(query, pool.k[0], pool.v[0], cpu_kernels.plan_decode([table], []), SCALING)
    assert out.dtype == torch.float32 and (out[0].double() - _alone(pool, query[0].float(), table)).abs().max() <= 1e-5
    assert not cpu_kernels.attends(torch.zeros(4, 1, 12))  # a head_dim the kernel does not take: torch's path


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_steps_new_rows_are_stored_as_torch_would_store_them(dtype):
    """Rows of a step's qkv output (a strided view) into scattered slots: float32 as is, bf16 rounded to nearest even
    as `.to(torch.bfloat16)` rounds, ties and the extremes included."""
    qkv = torch.randn(5, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM) * 100
    qkv[0, NUM_HEADS, :4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 3.4e38, -0.0])  # ties either way, overflow
    rows = qkv[:, NUM_HEADS : NUM_HEADS + NUM_KV_HEADS]  # [5, kv_heads, head_dim], rows further apart
    slots = torch.tensor([7, 3, 900, 41, 0])
    pool, expected = (torch.zeros(1000, NUM_KV_HEADS, HEAD_DIM, dtype=dtype) for _ in range(2))
    cpu_kernels.store(pool, slots, rows)
    expected.index_copy_(0, slots, rows.to(dtype))
    assert torch.equal(pool.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       expected.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    with pytest.raises(IndexError):  # checked before anything is written
        cpu_kernels.store(pool, torch.tensor([1, 2, 3, 4, 1000]), rows)
    with pytest.raises(ValueError):
        cpu_kernels.store(pool, slots.to(torch.int32), rows)
    assert torch.equal(pool[1:5], expected[1:5])
    queries = (qkv / 100)[:, :NUM_HEADS]  # read in place: the same attention as from a contiguous copy
    plan, context = cpu_kernels.plan_decode([torch.arange(40 + row) for row in range(5)], []), _pool(4, dtype=dtype)
    in_place = cpu_kernels.decode_attention(queries, context.k[0], context.v[0], plan, SCALING)
    copied = cpu_kernels.decode_attention(queries.contiguous(), context.k[0], context.v[0], plan, SCALING)
    assert queries.stride(0) > NUM_HEADS * HEAD_DIM and torch.equal(in_place, copied)


needs_amx = pytest.mark.skipif(
    not cpu_kernels.chunk_attends(torch.zeros(1, 1, 64, dtype=torch.bfloat16)),
    reason="chunk_attention needs a CPU with AMX-BF16 (and the CPU kernels built)")


def _causal_mask(tokens: int, context: int) -> torch.Tensor:
    """bool `[tokens, context]`: a chunk of the context's last `tokens` tokens, token i seeing keys up to its own."""
    return torch.arange(context).unsqueeze(0) <= torch.arange(context - tokens, context).unsqueeze(1)


def _chunk_exact(query: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, slots: torch.Tensor,
                 scale: float) -> torch.Tensor:
    """A chunk's causal attention in float64 on its queries rounded to bf16 (as the kernel and SDPA on the pool's
    dtype take them): query `[tokens, heads, head_dim]`, the chunk the last `tokens` of the context at `slots`."""
    keys = pool_k[slots].double().transpose(0, 1).unsqueeze(0)  # [1, kv_heads, context, head_dim]
    values = pool_v[slots].double().transpose(0, 1).unsqueeze(0)
    queries = query.to(torch.bfloat16).double().transpose(0, 1).unsqueeze(0)
    return F.scaled_dot_product_attention(queries, keys, values, attn_mask=_causal_mask(len(query), len(slots)),
                                          scale=scale, enable_gqa=True)[0].transpose(0, 1)


def _chunk_tolerance(pool_v: torch.Tensor) -> float:
    """Each probability is rounded to bf16 (a relative error of at most 2**-9) before it weighs a value: the
    output moves by at most that times the largest value; twice that leaves room for the float32 sums."""
    return 2**-8 * pool_v.abs().max().item()


@needs_amx
@pytest.mark.parametrize(("tokens", "context", "heads", "kv_heads", "head_dim"), [
    (25, 2073, 9, 3, 64),  # SmolLM2's shape: a short question after a long cached system prompt
    (1, 17, 4, 1, 32),  # one token, a context shorter than one tile of keys
    (64, 64, 9, 3, 64),  # nothing cached: plain causal attention
    (5, 40, 8, 2, 128),
    (7, 300, 6, 6, 96),  # no GQA; head_dim not a multiple of 64
    (33, 1000, 12, 4, 64),  # rows in partial blocks of 16
])
def test_a_prefill_chunk_attends_its_context_causally_on_amx(tokens, context, heads, kv_heads, head_dim):
    torch.manual_seed(tokens + context)
    pool_k, pool_v = (torch.randn(3000, kv_heads, head_dim) * scale for scale in (2.0, 1.0))
    pool_k, pool_v = pool_k.to(torch.bfloat16), pool_v.to(torch.bfloat16)
    slots = torch.randperm(3000)[:context]  # scattered
    qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim) * 2
    query = qkv[:, :heads]  # a view of a step's qkv output, read in place
    out = torch.full((tokens + 3, heads, head_dim), float("nan"))
    cpu_kernels.chunk_attention(query, pool_k, pool_v, slots, head_dim**-0.5, out[2 : 2 + tokens])
    exact = _chunk_exact(query, pool_k, pool_v, slots, head_dim**-0.5)
    assert (out[2 : 2 + tokens].double() - exact).abs().max() <= _chunk_tolerance(pool_v)
    assert out[:2].isnan().all() and out[2 + tokens :].isnan().all()  # nothing written outside its rows
    sdpa = F.scaled_dot_product_attention(  # the path it replaces, on the same bf16 inputs
        query.to(torch.bfloat16).transpose(0, 1).unsqueeze(0), pool_k[slots].transpose(0, 1).unsqueeze(0),
        pool_v[slots].transpose(0, 1).unsqueeze(0), attn_mask=_causal_mask(tokens, context), scale=head_dim**-0.5,
        enable_gqa=True,
    )[0].transpose(0, 1)
    assert (sdpa.double() - exact).abs().max() <= _chunk_tolerance(pool_v)  # the bound holds for torch too


@needs_amx
def test_chunk_attention_refuses_what_it_cannot_read():
    pool = torch.zeros(100, 3, 64, dtype=torch.bfloat16)
    query, out = torch.randn(4, 9, 64), torch.empty(4, 9, 64)
    with pytest.raises(IndexError):
        cpu_kernels.chunk_attention(query, pool, pool, torch.tensor([0, 1, 2, 3, 100]), 0.125, out)
    with pytest.raises(ValueError):  # fewer context slots than tokens
        cpu_kernels.chunk_attention(query, pool, pool, torch.tensor([0, 1, 2]), 0.125, out)
    with pytest.raises(ValueError):
        cpu_kernels.chunk_attention(query, pool, pool, torch.arange(10), 0.125, torch.empty(4, 9, 32))
    with pytest.raises(ValueError):
        cpu_kernels.chunk_attention(query, pool, pool, torch.arange(10, dtype=torch.int32), 0.125, out)
    with pytest.raises(ValueError):  # a float32 pool: not read as bf16
        cpu_kernels.chunk_attention(query, pool.float(), pool.float(), torch.arange(10), 0.125, out)
    with pytest.raises(ValueError):  # rows written over each other
        cpu_kernels.chunk_attention(query, pool, pool, torch.arange(10), 0.125, torch.empty(1, 9, 64).expand(4, 9, 64))
    assert not cpu_kernels.chunk_attends(torch.zeros(100, 3, 48, dtype=torch.bfloat16))
    assert not cpu_kernels.chunk_attends(torch.zeros(100, 3, 64))  # float32 pools keep torch's SDPA
