"""Batch invariance: a token's K/V and logits do not depend on the step around it, so the cache never changes an
answer.

- the kernels (local_engine.model.invariant_kernels): each row of the matmul and of attention is the same bits
  whatever else shares the call, within float32 rounding of a float64 reference;
- the runner: one prompt computed in one chunk, in chunks of any size, with its prefix already in the pool, or beside
  other sequences gives the same logits bit for bit, in float32 and with bfloat16 weights and pool;
- the engine on SmolLM2 in the default dtype, over HTTP with the official `openai` package: greedy and seeded answers
  identical cold, fully cached, partly cached, prefilled in small chunks, batched with other requests, and loaded back
  from the host and disk tiers.
"""

from __future__ import annotations

import concurrent.futures

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import OpenAI

from local_engine.bench.engine import system_prompt
from local_engine.cache import KVPool
from local_engine.model import invariant_kernels
from local_engine.model.invariant_forward import InvariantLlamaForward
from local_engine.model.loader import dtype_for, load_model
from local_engine.model.runner import ModelRunner, ScheduledChunk

from .conftest import build_tiny_llama
from .server_fixtures import served_engine

pytestmark = pytest.mark.skipif(not invariant_kernels.runs(torch.float32, 64, 9, 3),
                                reason="the CPU kernels are not built here")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_matmul_row_is_the_same_bits_whatever_shares_the_call(dtype):
    torch.manual_seed(0)
    weight = (torch.randn(1000, 576) * 0.05).to(dtype)  # 1000 columns: the last panel is partly padding
    packed = invariant_kernels.PanelWeight(weight)
    x = torch.randn(300, 576)
    whole = packed(x)
    exact = x.double() @ weight.double().T
    assert (whole.double() - exact).abs().max() < 1e-4
    for rows in (1, 2, 3, 4, 7, 97, 200):
        for start in (0, 1, 50):
            assert torch.equal(packed(x[start : start + rows]), whole[start : start + rows])
    strided = torch.randn(40, 1000)[:, :576]  # rows further apart than their features
    assert torch.equal(packed(strided), packed(strided.contiguous()))


def test_a_matmul_refuses_what_it_cannot_compute():
    packed = invariant_kernels.PanelWeight(torch.randn(64, 32))
    with pytest.raises(ValueError):
        packed(torch.randn(3, 31))
    with pytest.raises(ValueError):
        packed(torch.randn(3, 32, dtype=torch.float64))
    with pytest.raises(ValueError):
        invariant_kernels.PanelWeight(torch.randn(64, 32, dtype=torch.float16))


def _reference_attention(query, pool_k, pool_v, table, scale):
    """Causal attention of the last len(query) tokens of `table`, in float64."""
    tokens, heads, _ = query.shape
    group = heads // pool_k.shape[1]
    keys = pool_k[table].double().repeat_interleave(group, dim=1)
    values = pool_v[table].double().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,khd->htk", query.double(), keys) * scale
    visible = torch.ones(tokens, len(table), dtype=torch.bool).tril(diagonal=len(table) - tokens)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("htk,khd->thd", scores.softmax(-1), values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_attention_row_is_the_same_bits_as_a_decode_row_a_chunk_row_or_beside_others(dtype):
    torch.manual_seed(1)
    heads, kv_heads, head_dim, num_slots = 9, 3, 64, 3000
    pool_k = torch.randn(num_slots, kv_heads, head_dim).to(dtype)
    pool_v = torch.randn(num_slots, kv_heads, head_dim).to(dtype)
    table = torch.randperm(num_slots)[:301]  # scattered slots
    query = torch.randn(301, heads, head_dim)
    whole = torch.empty_like(query)
    invariant_kernels.attention(query, pool_k, pool_v, invariant_kernels.plan_attention([table], [301]), 0.125,
                                whole)
    assert (whole.double() - _reference_attention(query, pool_k, pool_v, table, 0.125)).abs().max() < 1e-5
    for position in (0, 1, 6, 150, 300):  # as a decode row on its own prefix
        alone = torch.empty(1, heads, head_dim)
        plan = invariant_kernels.plan_attention([table[: position + 1]], [1])
        invariant_kernels.attention(query[position : position + 1], pool_k, pool_v, plan, 0.125, alone)
        assert torch.equal(alone[0], whole[position])
    # the last 45 tokens as a chunk after 256 cached, in a step with a decode row and another chunk before it
    others = [torch.randperm(num_slots)[:90], torch.randperm(num_slots)[:17]]
    step_query = torch.cat([torch.randn(1, heads, head_dim), torch.randn(5, heads, head_dim), query[256:]])
    out = torch.empty_like(step_query)
    plan = invariant_kernels.plan_attention([others[0], others[1], table], [1, 5, 45])
    invariant_kernels.attention(step_query, pool_k, pool_v, plan, 0.125, out)
    assert torch.equal(out[6:], whole[256:])


def test_attention_refuses_shapes_it_does_not_take():
    pool = torch.randn(10, 3, 64)
    plan = invariant_kernels.plan_attention([torch.arange(4)], [1])
    with pytest.raises(ValueError):
        invariant_kernels.attention(torch.randn(1, 8, 64), pool, pool, plan, 0.1, torch.empty(1, 8, 64))  # 8 % 3
    with pytest.raises(ValueError):
        invariant_kernels.attention(torch.randn(1, 9, 64), pool, pool, plan, 0.1, torch.empty(1, 9, 32))
    with pytest.raises(ValueError):
        invariant_kernels.plan_attention([torch.arange(4)], [5])
    beyond = invariant_kernels.plan_attention([torch.tensor([0, 1, 10])], [1])  # slot 10 of a 10-slot pool
    out = torch.full((1, 9, 64), 7.0)
    with pytest.raises(IndexError):
        invariant_kernels.attention(torch.randn(1, 9, 64), pool, pool, beyond, 0.1, out)
    assert out.eq(7.0).all()  # nothing written


def _prompt_logits(runner: ModelRunner, prompt: list[int], slots: torch.Tensor, sizes: list[int],
                   beside: list[ScheduledChunk] = ()) -> torch.Tensor:
    """The last token's logits of `prompt` prefilled in chunks of `sizes` at `slots`, the last step beside
    `beside`."""
    start = 0
    for size in sizes:
        end = start + size
        chunk = ScheduledChunk(prompt[start:end], slots[:end], end == len(prompt))
        logits = runner.forward((list(beside) if end == len(prompt) else []) + [chunk])
        start = end
    return logits[-1]


def _assert_runner_invariant(model: torch.nn.Module, dtype: torch.dtype, length: int) -> None:
    pool = KVPool(ModelRunner.pool_config_for(model, torch.device("cpu"), dtype), 6 * length + 400)
    runner = ModelRunner(model, pool, batch_invariant=True)
    assert runner.batch_invariant and runner.graphed is None
    prompt = torch.randint(5, model.config.vocab_size, (length,), generator=torch.Generator().manual_seed(3)).tolist()
    cold = _prompt_logits(runner, prompt, torch.arange(0, length), [length])
    beside = [ScheduledChunk([11], torch.arange(6 * length, 6 * length + 40), True),
              ScheduledChunk([12, 13, 14], torch.arange(6 * length + 40, 6 * length + 140), True)]
    ways = {
        "small chunks": [7] * (length // 7) + ([length % 7] if length % 7 else []),
        "all but the last token cached": [length - 1, 1],
        "half cached": [length // 2, length - length // 2],
    }
    for index, (way, sizes) in enumerate(ways.items(), start=1):
        slots = torch.randperm(length) + index * length  # scattered slots in a region of their own
        logits = _prompt_logits(runner, prompt, slots, sizes)
        assert torch.equal(logits, cold), way
    beside_logits = _prompt_logits(runner, prompt, torch.arange(4 * length, 5 * length), [length - 1, 1], beside)
    assert torch.equal(beside_logits, cold), "beside a decode row and another chunk"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tiny_models_logits_are_the_same_bits_however_the_prompt_was_stepped(dtype):
    model = build_tiny_llama(512, num_layers=2).to(dtype)
    _assert_runner_invariant(model, dtype, 150)


@pytest.mark.real_model
def test_smollm2_in_bf16_is_invariant_too():
    """The dtype `--dtype auto` picks on a CPU with native bf16 (AVX512-BF16 or AMX)."""
    loaded = load_model("smollm2", torch.device("cpu"), dtype="bfloat16")
    assert InvariantLlamaForward.supports(loaded.model)
    _assert_runner_invariant(loaded.model, torch.bfloat16, 64)


@pytest.fixture(scope="module")
def smollm2_default(smollm2_loaded):
    """SmolLM2 in the dtype `--dtype auto` picks on this machine."""
    if dtype_for(torch.device("cpu"), "auto") == torch.float32:
        return smollm2_loaded
    return load_model("smollm2", torch.device("cpu"), dtype="auto")


MAX_TOKENS = 12
SEED = 1234


def _answers(base_url: str, chat: list[dict], salt: str) -> tuple[str, str, int]:
    """(greedy answer, seeded answer, cached tokens of the greedy request) under the cache namespace `salt`."""
    client = OpenAI(base_url=base_url + "/v1", api_key="not-needed", max_retries=0, timeout=600)
    greedy = client.chat.completions.create(model="smollm2", messages=chat, max_tokens=MAX_TOKENS, temperature=0,
                                            extra_body={"cache_salt": salt})
    seeded = client.chat.completions.create(model="smollm2", messages=chat, max_tokens=MAX_TOKENS, temperature=0.9,
                                            seed=SEED, extra_body={"cache_salt": salt})
    return (greedy.choices[0].message.content, seeded.choices[0].message.content,
            greedy.usage.prompt_tokens_details.cached_tokens)


def _chat(system: str, question: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def two_engines(smollm2_default):
    """Two engines on the default configuration but their step budgets: 512 tokens, and 24 (long prompts are
    prefilled in many small chunks)."""
    with served_engine(smollm2_default, max_num_batched_tokens=512) as (wide, _), \
            served_engine(smollm2_default, max_num_batched_tokens=24) as (narrow, _):
        yield wide, narrow


@pytest.mark.real_model
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(index=st.integers(0, 10_000), length=st.integers(60, 400),
       question=st.sampled_from(["Which rule covers refunds?", "Summarise rule 3.", "What must I never do?"]))
def test_answers_are_identical_cold_cached_partly_cached_chunked_and_batched(two_engines, smollm2_default, index,
                                                                             length, question):
    wide, narrow = two_engines
    tokenizer = smollm2_default.tokenizer
    system = system_prompt(tokenizer, index, length, seed=7)
    chat = _chat(system, question)
    salt = f"example-{index}-{length}-{len(question)}"
    greedy, seeded, cached = _answers(wide, chat, salt + "-cold")
    assert cached == 0
    # fully cached: the same prompt again in the same namespace
    again_greedy, again_seeded, cached = _answers(wide, chat, salt + "-cold")
    assert cached > length
    assert (again_greedy, again_seeded) == (greedy, seeded)
    # partly cached: the system prompt computed by an earlier request with another question
    _answers(wide, _chat(system, "Hello?"), salt + "-partial")
    part_greedy, part_seeded, cached = _answers(wide, chat, salt + "-partial")
    assert 0 < cached
    assert (part_greedy, part_seeded) == (greedy, seeded)
    # prefilled 24 tokens a step on the other engine
    assert _answers(narrow, chat, salt + "-narrow")[:2] == (greedy, seeded)
    # beside three other requests of other lengths, sent at the same time
    others = [_chat(system_prompt(tokenizer, index + i, 50 + 90 * i, seed=8), question) for i in range(1, 4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_answers, wide, chat, salt + "-batched")]
        futures += [pool.submit(_answers, wide, other, salt + f"-other-{i}") for i, other in enumerate(others)]
        assert futures[0].result()[:2] == (greedy, seeded)
        for future in futures[1:]:
            future.result()


@pytest.mark.real_model
def test_answers_loaded_back_from_the_host_and_disk_tiers_are_identical_to_cold_ones(smollm2_default, tmp_path):
    tokenizer = smollm2_default.tokenizer
    chat = _chat(system_prompt(tokenizer, 1, 1200, seed=9), "Which rule covers refunds?")
    fillers = [_chat(system_prompt(tokenizer, 10 + i, 1200, seed=9), "Hi") for i in range(3)]
    with served_engine(smollm2_default, kv_cache_tokens=3072, host_cache_tokens=16384,
                       disk_cache_dir=str(tmp_path), disk_cache_gib=1.0) as (base_url, _):
        cold = _answers(base_url, chat, "tiers")
        for filler in fillers:  # push the prompt out of the 3k-token device pool
            _answers(base_url, filler, "tiers")
        client = OpenAI(base_url=base_url + "/v1", api_key="not-needed", max_retries=0, timeout=600)
        from_host = client.chat.completions.create(model="smollm2", messages=chat, max_tokens=MAX_TOKENS,
                                                   temperature=0, extra_body={"cache_salt": "tiers"})
        assert from_host.prefix_cache["tiers"]["host"] > 0
        assert from_host.choices[0].message.content == cold[0]
        assert _answers(base_url, chat, "tiers")[:2] == cold[:2]
    with served_engine(smollm2_default, kv_cache_tokens=3072, disk_cache_dir=str(tmp_path),
                       disk_cache_gib=1.0) as (base_url, _):  # a restart: only the disk tier holds the prompt
        client = OpenAI(base_url=base_url + "/v1", api_key="not-needed", max_retries=0, timeout=600)
        from_disk = client.chat.completions.create(model="smollm2", messages=chat, max_tokens=MAX_TOKENS,
                                                   temperature=0, extra_body={"cache_salt": "tiers"})
        assert from_disk.prefix_cache["tiers"]["disk"] > 0
        assert from_disk.choices[0].message.content == cold[0]
        assert _answers(base_url, chat, "tiers")[1] == cold[1]
