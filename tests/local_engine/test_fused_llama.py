"""The fused Llama forward computes what transformers' forward computes (in bf16 on the CPU bit for bit), holds no
second plain copy of the weights, and leaves models outside its scope to transformers."""

from __future__ import annotations

import torch

from local_engine.cache import KVPool, SlotAllocator
from local_engine.model.fused_llama import FusedLlamaForward
from local_engine.model.runner import ModelRunner, ScheduledChunk

from .conftest import build_tiny_llama


def _runner(model, fused: bool) -> ModelRunner:
    config = ModelRunner.pool_config_for(model, torch.device("cpu"), torch.float32)
    return ModelRunner(model, KVPool(config, 1024), fused=fused)


def test_fused_and_transformers_forwards_give_the_same_logits_through_prefill_and_batched_decode():
    model = build_tiny_llama(vocab_size=300, seed=3)
    fused, plain = _runner(model, True), _runner(model, False)
    assert fused._fused is not None and plain._fused is None
    generator = torch.Generator().manual_seed(0)
    lengths = [40, 7, 90]
    prompts = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in lengths]
    allocator = SlotAllocator(1024)
    # Scattered slot tables, as after evictions.
    tables = [allocator.alloc(n + 10)[torch.randperm(n + 10, generator=generator)] for n in lengths]
    results = [runner.run([ScheduledChunk(p, t[: len(p)], True, all_logits=True) for p, t in zip(prompts[:2], tables)])
               for runner in (fused, plain)]
    for a, b in zip(results[0].chunk_logits.values(), results[1].chunk_logits.values(), strict=True):
        assert (a - b).abs().max().item() <= 1e-4
    # Decode steps of the two prompts that fit, batched, next to a prefill chunk of the third.
    next_tokens = [[11], [12]]
    for step in range(3):
        chunks = [ScheduledChunk(next_tokens[i], tables[i][: lengths[i] + step + 1], True) for i in range(2)]
        chunks.append(ScheduledChunk(prompts[2][step * 10 : step * 10 + 10], tables[2][: step * 10 + 10], True))
        a, b = fused.forward(chunks), plain.forward(chunks)
        assert a.shape == b.shape == (3, 300)
        assert (a - b).abs().max().item() <= 1e-4
        next_tokens = [[int(row.argmax())] for row in a[:2]]


def test_the_fused_weights_are_views_shared_with_the_model_and_built_once():
    model = build_tiny_llama(vocab_size=100, seed=1)
    forward = FusedLlamaForward.of(model)
    assert FusedLlamaForward.of(model) is forward
    attn = model.model.layers[0].self_attn
    fused = forward.layers[0].qkv.weight
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert proj.weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
    assert fused.shape == (64 + 2 * 32, 64)  # 4 query heads and 2 KV heads of 16


def test_models_with_projection_biases_keep_the_transformers_forward():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
    model = LlamaForCausalLM(config).eval()
    assert not FusedLlamaForward.supports(model)
    assert _runner(model, True)._fused is None


def test_in_bfloat16_on_the_cpu_the_logits_and_greedy_tokens_are_transformers_bit_for_bit():
    model = build_tiny_llama(vocab_size=300, seed=5).to(torch.bfloat16)
    config = ModelRunner.pool_config_for(model, torch.device("cpu"), torch.bfloat16)
    fused, plain = (ModelRunner(model, KVPool(config, 1024), fused=flag) for flag in (True, False))
    assert fused._fused is not None and plain._fused is None
    generator = torch.Generator().manual_seed(1)
    lengths = [70, 9, 130]
    prompts = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in lengths]
    scattered = SlotAllocator(1024).alloc(1024)[torch.randperm(1024, generator=generator)]
    tables = [scattered[sum(lengths[:i]) + 8 * i :][: n + 8] for i, n in enumerate(lengths)]  # disjoint, as after evictions
    for prompt, table in zip(prompts, tables):
        a, b = (runner.forward([ScheduledChunk(prompt, table[: len(prompt)], True)]) for runner in (fused, plain))
        assert torch.equal(a, b)
    # One sequence alone, then all three batched: greedy tokens from each runner's own logits.
    tokens = {id(runner): [[p[-1]] for p in prompts] for runner in (fused, plain)}
    for step in range(6):
        rows = [0] if step < 3 else [0, 1, 2]
        logits = []
        for runner in (fused, plain):
            chunks = [ScheduledChunk(tokens[id(runner)][r], tables[r][: lengths[r] + step + 1], True) for r in rows]
            logits.append(runner.forward(chunks))
            for r, row in zip(rows, logits[-1]):
                tokens[id(runner)][r] = [int(row.argmax())]
        assert torch.equal(logits[0], logits[1])
    assert tokens[id(fused)] == tokens[id(plain)]


def test_bfloat16_models_off_the_cpu_keep_the_transformers_forward():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval()
    assert FusedLlamaForward.supports(model)
    assert FusedLlamaForward.supports(model.to(torch.bfloat16))
    assert not FusedLlamaForward.supports(model.to("meta"))  # any device but the CPU
    assert not FusedLlamaForward.supports(model.to(torch.float16))
