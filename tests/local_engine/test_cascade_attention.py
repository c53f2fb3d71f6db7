"""Shared-prefix (cascade) decode attention computes what the plain padded path and per-sequence attention compute."""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F

from local_engine.model import cpu_kernels, paged_attention as paged_attention_module
from local_engine.cache.kv_pool import KVPool, KVPoolConfig
from local_engine.model.cascade_attention import SlotRead, cascade_attention, find_shared_prefixes, split_runs
from local_engine.engine.types import GenerationRequest
from local_engine.model.paged_attention import build_paged_batch, paged_attention
from local_engine.engine.sampling import SamplingParams

from .conftest import run_to_end
from .test_batching import token_ids

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 9, 3, 64
SCALING = HEAD_DIM**-0.5


@pytest.fixture(autouse=True)
def torch_attention(monkeypatch):
    """These tests are of the torch paths, which decode rows take where the CPU kernels do not run
    (tests/local_engine/test_cpu_kernels.py compares the kernel with them)."""
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)


def mixed_tables() -> tuple[list[torch.Tensor], list[int]]:
    """Eight decode tables: three rows on prefix A (100 slots) with suffixes of different lengths, two on prefix B
    (80 slots), one row sharing nothing, one sharing only A's first 10 slots and one of scattered slots; then a
    4-token prefill chunk on A.
    Returns (tables, num_query_tokens)."""
    prefix_a = torch.arange(0, 100)
    prefix_b = torch.arange(100, 180)
    fresh = iter(range(200, 1000))

    def own(n: int) -> torch.Tensor:
        return torch.tensor([next(fresh) for _ in range(n)])

    decode = [
        torch.cat([prefix_a, own(1)]),
        torch.cat([prefix_a, own(37)]),
        torch.cat([prefix_a, own(5)]),
        torch.cat([prefix_b, own(12)]),
        own(150),
        torch.cat([prefix_b, own(1)]),
        torch.cat([prefix_a[:10], own(90)]),
        torch.arange(600, 720, 2),  # scattered, no run long enough to read as a view
    ]
    prefill = torch.cat([prefix_a, own(6)])
    return decode + [prefill], [1] * len(decode) + [4]


def run(tables, counts, num_decode, min_shared_prefix, seed=0, pool_slots=1000):
    torch.manual_seed(seed)
    pool = KVPool(KVPoolConfig(1, NUM_KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu")), pool_slots)
    pool.k.normal_()
    pool.v.normal_()
    total = sum(counts)
    query = torch.randn(1, NUM_HEADS, total, HEAD_DIM)
    key = torch.randn(1, NUM_KV_HEADS, total, HEAD_DIM)
    value = torch.randn(1, NUM_KV_HEADS, total, HEAD_DIM)
    batch = build_paged_batch(pool, tables, counts, num_decode, min_shared_prefix=min_shared_prefix)
    out = paged_attention(batch, 0, query, key, value, SCALING)
    return batch, out[0], query, pool


def test_groups_are_found_by_their_shared_leading_slots():
    tables, _ = mixed_tables()
    groups = sorted(find_shared_prefixes(tables[:7], 64))
    assert groups == [([0, 1, 2], 100), ([3, 5], 80)]


def test_cascade_equals_the_padded_path_and_per_sequence_attention():
    tables, counts = mixed_tables()
    num_decode = 8
    batch, cascade_out, query, pool = run(tables, counts, num_decode, 64)
    # Two shared groups, rows 4 and 6 alone on contexts with a long run, row 7 (scattered) on the padded path.
    assert batch.cascade.rows.tolist() == [0, 1, 2, 3, 5, 4, 6]
    assert [(group.start, group.num_rows) for group in batch.cascade.groups] == [(0, 3), (3, 2), (5, 1), (6, 1)]
    assert batch.decode_rows.tolist() == [7]
    plain_batch, plain_out, _, _ = run(tables, counts, num_decode, None)
    assert plain_batch.cascade is None and plain_batch.decode_rows is None
    assert (cascade_out - plain_out).abs().max() <= 1e-5
    for row, table in enumerate(tables[:num_decode]):  # the pool already holds the step's new K/V
        keys = pool.k[0][table].transpose(0, 1).unsqueeze(0)
        values = pool.v[0][table].transpose(0, 1).unsqueeze(0)
        alone = F.scaled_dot_product_attention(
            query[:, :, row : row + 1], keys, values, scale=SCALING, enable_gqa=True
        )[0, :, 0]
        assert (cascade_out[row] - alone).abs().max() <= 1e-5


def test_in_bf16_rows_alone_are_gathered_and_groups_stay():
    tables, counts = mixed_tables()
    torch.manual_seed(0)
    pool = KVPool(KVPoolConfig(1, NUM_KV_HEADS, HEAD_DIM, torch.bfloat16, torch.device("cpu")), 1000)
    pool.k.normal_()
    pool.v.normal_()
    total = sum(counts)
    query = torch.randn(1, NUM_HEADS, total, HEAD_DIM, dtype=torch.bfloat16)
    key = torch.randn(1, NUM_KV_HEADS, total, HEAD_DIM, dtype=torch.bfloat16)
    value = torch.randn(1, NUM_KV_HEADS, total, HEAD_DIM, dtype=torch.bfloat16)
    batch = build_paged_batch(pool, tables, counts, 8)
    out = paged_attention(batch, 0, query, key, value, SCALING)[0]
    assert batch.cascade.rows.tolist() == [0, 1, 2, 3, 5]  # the two shared groups
    assert batch.decode_rows.tolist() == [4, 6, 7]  # rows alone: the padded path
    for row, table in enumerate(tables[:8]):
        keys = pool.k[0][table].float().transpose(0, 1).unsqueeze(0)
        values = pool.v[0][table].float().transpose(0, 1).unsqueeze(0)
        alone = F.scaled_dot_product_attention(
            query[:, :, row : row + 1].float(), keys, values, scale=SCALING, enable_gqa=True
        )[0, :, 0]
        assert (out[row].float() - alone).abs().max() <= 0.02  # bf16's rounding of the output


def test_a_batch_made_only_of_one_group_and_long_prefixes():
    prefix = torch.arange(1700)
    tables = [torch.cat([prefix, torch.arange(2000 + 50 * i, 2000 + 50 * i + 1 + i)]) for i in range(8)]
    torch.manual_seed(1)
    pool = KVPool(KVPoolConfig(1, NUM_KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu")), 2500)
    pool.k.normal_()
    pool.v.normal_()
    query, key, value = torch.randn(1, NUM_HEADS, 8, HEAD_DIM), *torch.randn(2, 1, NUM_KV_HEADS, 8, HEAD_DIM)
    cascade = build_paged_batch(pool, tables, [1] * 8, 8)
    (group,) = cascade.cascade.groups
    assert cascade.decode_slots is None and group.prefix == SlotRead(((0, 1700),), None, 1700)
    out = paged_attention(cascade, 0, query, key, value, SCALING)
    plain = paged_attention(build_paged_batch(pool, tables, [1] * 8, 8, min_shared_prefix=None), 0, query, key,
                            value, SCALING)
    assert (out - plain).abs().max() <= 1e-5


@pytest.mark.parametrize("page_size", [1, 16])
def test_requests_on_a_cached_prefix_decode_through_cascade_groups_with_unchanged_output(make_engine, page_size,
                                                                                          monkeypatch):
    calls = []

    def counting(*args, **kwargs):
        calls.append(max(group.num_rows for group in args[2].groups))
        return cascade_attention(*args, **kwargs)

    monkeypatch.setattr(paged_attention_module, "cascade_attention", counting)
    engine = make_engine(kv_cache_tokens=8192, page_size=page_size, max_num_seqs=8, max_num_batched_tokens=64)
    shared = token_ids(7, 100, 49152)
    prompts = [tuple(shared + token_ids(200 + i, 3 + 5 * i, 49152)) for i in range(8)]
    params = [SamplingParams(max_tokens=4 + 2 * i, temperature=0.0, ignore_eos=True) for i in range(8)]

    async def alone():
        return [(await run_to_end(engine, GenerationRequest(p, s)))[1] for p, s in zip(prompts, params)]

    async def together():
        await run_to_end(engine, GenerationRequest(tuple(shared), SamplingParams(max_tokens=1, temperature=0.0)))
        results = await asyncio.gather(*(run_to_end(engine, GenerationRequest(p, s)) for p, s in zip(prompts, params)))
        return [text for _, text, _ in results]

    expected = asyncio.run(alone())
    engine.flush_cache()
    calls.clear()
    assert asyncio.run(together()) == expected
    assert calls and max(calls) >= 2
    engine.check_integrity()


def test_contiguous_runs_are_read_as_views_and_others_gathered():
    from local_engine.model.cascade_attention import contiguous_start, read_slots

    assert contiguous_start(torch.arange(5, 9)) == 5
    assert contiguous_start(torch.tensor([5, 7, 6, 8])) is None  # same ends, not a run
    assert contiguous_start(torch.tensor([3])) == 3
    layer = torch.randn(20, NUM_KV_HEADS, HEAD_DIM)
    view = read_slots(layer, torch.arange(4, 9), 4)
    assert view.data_ptr() == layer[4].data_ptr() and torch.equal(view, layer[4:9])
    assert torch.equal(read_slots(layer, torch.tensor([9, 2, 4]), None), layer[[9, 2, 4]])


def test_a_scattered_prefix_attends_as_a_contiguous_one():
    """The same K/V placed in one run of slots and scattered over the pool give the same attention."""
    torch.manual_seed(3)
    run_tables = [torch.cat([torch.arange(0, 120), torch.tensor([500 + i])]) for i in range(4)]
    scattered_prefix = torch.randperm(400)[:120] + 100
    scattered_tables = [torch.cat([scattered_prefix, torch.tensor([500 + i])]) for i in range(4)]
    pool_run = KVPool(KVPoolConfig(1, NUM_KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu")), 600)
    pool_run.k.normal_()
    pool_run.v.normal_()
    pool_scattered = KVPool(KVPoolConfig(1, NUM_KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu")), 600)
    pool_scattered.k[0][scattered_prefix] = pool_run.k[0][:120]
    pool_scattered.v[0][scattered_prefix] = pool_run.v[0][:120]
    query = torch.randn(1, NUM_HEADS, 4, HEAD_DIM)
    key = torch.randn(1, NUM_KV_HEADS, 4, HEAD_DIM)
    value = torch.randn(1, NUM_KV_HEADS, 4, HEAD_DIM)
    run_batch = build_paged_batch(pool_run, run_tables, [1] * 4, 4)
    scattered_batch = build_paged_batch(pool_scattered, scattered_tables, [1] * 4, 4)
    assert run_batch.cascade.groups[0].prefix == SlotRead(((0, 120),), None, 120)
    scattered_read = scattered_batch.cascade.groups[0].prefix
    assert scattered_read.views == () and len(scattered_read.gathered) == 120
    out_run = paged_attention(run_batch, 0, query, key, value, SCALING)
    out_scattered = paged_attention(scattered_batch, 0, query, key, value, SCALING)
    assert (out_run - out_scattered).abs().max() <= 1e-5


def test_the_unfused_path_used_off_the_cpu_computes_the_same(monkeypatch):
    from local_engine.model import cascade_attention as cascade_module

    tables, counts = mixed_tables()
    _, fused_out, _, _ = run(tables, counts, 8, 64)
    monkeypatch.setattr(cascade_module, "_FUSED_CPU", None)
    _, plain_out, _, _ = run(tables, counts, 8, 64)
    assert (fused_out - plain_out).abs().max() <= 1e-5


def test_a_prompt_s_slots_split_into_views_of_long_runs_and_a_gathered_rest():
    """As a real prompt's table is: a chat template opening shared by every prompt (slots 0..9), the prompt's own run,
    then a few tokens written later elsewhere."""
    table = torch.cat([torch.arange(10), torch.arange(1572, 3278), torch.tensor([7306, 7307, 9000])])
    views, rest = split_runs(table)
    assert views == ((1572, 1706),) and rest.tolist() == [*range(10), 7306, 7307, 9000]
    assert split_runs(torch.arange(5, 70))[0] == ((5, 65),) and len(split_runs(torch.arange(5, 70))[1]) == 0
    assert split_runs(torch.arange(5, 60))[0] == () and len(split_runs(torch.arange(5, 60))[1]) == 55
    assert split_runs(torch.tensor([], dtype=torch.int64))[0] == ()


@pytest.mark.parametrize("num_rows", [1, 3])
@pytest.mark.parametrize("scattered", [3, 100])
def test_a_prefix_of_several_runs_attends_as_the_padded_path(num_rows, scattered):
    """Prefixes made of a short shared opening, two long runs and scattered slots, for a group of several rows and
    for a row alone. A few scattered slots join each row's suffix; many are gathered once for the group."""
    scattered_slots = torch.arange(3000, 3000 + 2 * scattered, 2)
    prefix = torch.cat([torch.arange(10), torch.arange(100, 300), scattered_slots, torch.arange(400, 480)])
    tables = [torch.cat([prefix, torch.tensor([900 + 7 * i + j for j in range(1 + 2 * i)])]) for i in range(num_rows)]
    batch, out, query, pool = run(tables, [1] * num_rows, num_rows, 64, pool_slots=4000)
    (group,) = batch.cascade.groups
    assert group.prefix.views == ((100, 200), (400, 80))
    if scattered == 3:  # 13 slots outside the views: read with each row's suffix
        assert group.prefix.gathered is None and group.prefix.num_slots == 280
        assert batch.cascade.suffix_slots.shape[1] == 13 + 1 + 2 * (num_rows - 1)
    else:
        assert len(group.prefix.gathered) == 110 and group.prefix.num_slots == 390
    plain_batch, plain_out, _, _ = run(tables, [1] * num_rows, num_rows, None, pool_slots=4000)
    assert plain_batch.cascade is None
    assert (out - plain_out).abs().max() <= 1e-5
