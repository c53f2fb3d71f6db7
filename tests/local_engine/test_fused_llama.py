"""The fused Llama forward computes what transformers' forward computes (in bf16 on the CPU bit for bit, or in float32
on the CPU kernels), holds no second plain copy of the weights, and leaves models outside its scope to transformers."""

from __future__ import annotations

import pytest
import torch

from local_engine.cache import KVPool, SlotAllocator
from local_engine.model import cpu_kernels
from local_engine.model.fused_llama import NATIVE_STEP_TOKENS, NATIVE_STEP_TOKENS_AMX, FusedLlamaForward
from local_engine.model.runner import ModelRunner, ScheduledChunk

from .conftest import build_tiny_llama

# Run again in CI with the CPU kernels off (Makefile `test`).
pytestmark = pytest.mark.model_forward


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


def test_in_bfloat16_on_the_cpu_the_logits_and_greedy_tokens_are_transformers_bit_for_bit(monkeypatch):
    """Off the CPU kernels (their bf16 decode steps compute in float32: the next test)."""
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
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


@pytest.mark.skipif(not cpu_kernels.available(), reason="the CPU kernels are not built or do not run here")
def test_on_the_cpu_kernels_a_bfloat16_decode_step_computes_in_float32_on_the_bf16_weights_and_kv():
    """Steps of up to NATIVE_STEP_TOKENS of a bf16 model (decode steps, a short prompt's prefill) round nothing but
    the K/V they store, and a longer step keeps transformers' rounding bit for bit. The short steps' logits are the
    float32 forward's on the same (bf16) weights within that rounding, closer to them than transformers' bf16
    forward, and give the same greedy token wherever the float32 top two are not within it."""
    model = build_tiny_llama(vocab_size=300, seed=6).to(torch.bfloat16)
    reference = build_tiny_llama(vocab_size=300, seed=6).to(torch.bfloat16).float()  # the same weights, in fp32
    runners = {}
    for name, net, dtype, fused in (("kernels", model, torch.bfloat16, True), ("transformers", model, torch.bfloat16,
                                    False), ("float32", reference, torch.float32, True)):
        config = ModelRunner.pool_config_for(net, torch.device("cpu"), dtype)
        runners[name] = ModelRunner(net, KVPool(config, 512), fused=fused)
    assert runners["kernels"]._fused.native
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in (12, 40)]
    tables = [torch.arange(0, 60), torch.arange(100, 160)]
    # measured: at most 0.0009-0.00096, against 0.0018-0.0028 for transformers' (2-core Xeon and EPYC)
    tolerance = 0.002
    for prompt, table in zip(prompts, tables):
        logits = {name: runner.forward([ScheduledChunk(prompt, table[: len(prompt)], True)])
                  for name, runner in runners.items()}
        error = (logits["kernels"] - logits["float32"]).abs().max().item()
        assert error <= tolerance and error < (logits["transformers"].float() - logits["float32"]).abs().max()
    tokens = [[7], [9]]
    for step in range(6):
        chunks = [ScheduledChunk(tokens[i], tables[i][: len(prompts[i]) + step + 1], True) for i in range(2)]
        logits = {name: runner.forward(chunks) for name, runner in runners.items()}
        assert logits["kernels"].dtype == torch.float32
        error = (logits["kernels"] - logits["float32"]).abs().max().item()
        assert error <= tolerance and error < (logits["transformers"].float() - logits["float32"]).abs().max()
        top = logits["float32"].topk(2, dim=-1).values
        clear = top[:, 0] - top[:, 1] > 2 * tolerance
        assert torch.equal(logits["kernels"].argmax(-1)[clear], logits["float32"].argmax(-1)[clear])
        tokens = [[int(row.argmax())] for row in logits["float32"]]
    # A longer chunk keeps transformers' rounding, bit for bit.
    assert runners["kernels"].native_tokens == NATIVE_STEP_TOKENS  # head_dim 16: no AMX chunk attention
    longer = torch.randint(5, 300, (NATIVE_STEP_TOKENS + 1,), generator=generator).tolist()
    table = torch.arange(200, 200 + len(longer))
    assert torch.equal(runners["kernels"].forward([ScheduledChunk(longer, table, True)]),
                       runners["transformers"].forward([ScheduledChunk(longer, table, True)]))


def test_bfloat16_models_off_the_cpu_keep_the_transformers_forward():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval()
    assert FusedLlamaForward.supports(model)
    assert FusedLlamaForward.supports(model.to(torch.bfloat16))
    assert not FusedLlamaForward.supports(model.to("meta"))  # any device but the CPU
    assert not FusedLlamaForward.supports(model.to(torch.float16))


@pytest.mark.skipif(not cpu_kernels.available(), reason="the CPU kernels are not built or do not run here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_a_decode_step_in_one_kernel_call_equals_the_step_operation_by_operation(monkeypatch, dtype, head_dim):
    """Every layer of a decode step in one `decode_layers` call (up to the weights' `max_rows` rows) computes, bit for
    bit, the logits and stored K/V of the same kernels called one operation at a time; steps beside a prefill chunk,
    or of more rows, go operation by operation."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(head_dim)
    config = LlamaConfig(vocab_size=200, hidden_size=4 * head_dim, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    model = LlamaForCausalLM(config).eval().to(dtype)
    calls = []
    decode_layers = cpu_kernels.decode_layers
    monkeypatch.setattr(cpu_kernels, "decode_layers",
                        lambda *args: calls.append(args[0].shape[0]) or decode_layers(*args))
    pool_config = ModelRunner.pool_config_for(model, torch.device("cpu"), dtype)
    runners = {in_one_call: ModelRunner(model, KVPool(pool_config, 4096)) for in_one_call in (True, False)}
    layers = runners[True]._fused.decoder_layers  # both runners share the model's one FusedLlamaForward
    assert layers is not None
    max_rows = layers.max_rows
    generator = torch.Generator().manual_seed(1)
    lengths = [100 + 37 * row % 190 for row in range(max_rows + 2)]
    tables = [torch.randperm(4000, generator=generator)[: length + 10] for length in lengths]
    prompts = [torch.randint(3, 200, (length,), generator=generator).tolist() for length in lengths]
    shared = 80  # rows 0 and 1 share their first 80 tokens and slots: a cascade group in the decode plan
    prompts[1][:shared], tables[1][:shared] = prompts[0][:shared], tables[0][:shared]
    for runner in runners.values():
        for row, (prompt, table) in enumerate(zip(prompts, tables)):
            start = shared if row == 1 else 0
            runner.forward([ScheduledChunk(prompt[start:], table[: len(prompt)], True)])
    for step, rows in enumerate((1, max_rows, max_rows + 1, 3)):
        chunks = [ScheduledChunk([5 + row], tables[row][: lengths[row] + step + 1], True) for row in range(rows)]
        if step == 3:  # beside a prefill chunk
            chunks.append(ScheduledChunk([9, 10], tables[-1][: lengths[-1] + 2], True))
        logits = {}
        for in_one_call, runner in runners.items():
            runner._fused.decoder_layers = layers if in_one_call else None
            calls.clear()
            logits[in_one_call] = runner.forward(chunks)
            assert calls == ([rows] if in_one_call and rows <= max_rows and step != 3 else [])
        runners[True]._fused.decoder_layers = layers
        assert torch.equal(logits[True], logits[False])
        assert torch.equal(runners[True].pool.k, runners[False].pool.k)
        assert torch.equal(runners[True].pool.v, runners[False].pool.v)


@pytest.mark.skipif(not cpu_kernels.available(), reason="the CPU kernels are not built or do not run here")
def test_a_decode_step_in_one_kernel_call_refuses_bad_inputs_and_writes_nothing():
    model = build_tiny_llama(vocab_size=100, seed=4)
    runner = _runner(model, True)
    runner.forward([ScheduledChunk([5, 6, 7], torch.arange(3), True)])
    before_k, before_v = runner.pool.k.clone(), runner.pool.v.clone()
    hidden_before = torch.randn(1, 64)
    hidden = hidden_before.clone()
    plan = cpu_kernels.plan_decode([torch.arange(4)], [])
    step = cpu_kernels.DecodeStep(plan, torch.tensor([1024]), runner.pool.k, runner.pool.v)  # the pool has 1024
    cos, sin = torch.ones(1, 16), torch.zeros(1, 16)
    with pytest.raises(IndexError):
        cpu_kernels.decode_layers(hidden, runner._fused.decoder_layers, step, cos, sin)
    assert torch.equal(runner.pool.k, before_k) and torch.equal(runner.pool.v, before_v)
    assert torch.equal(hidden, hidden_before)
    in_pool = cpu_kernels.DecodeStep(plan, torch.tensor([5]), runner.pool.k, runner.pool.v)
    wrong = [(torch.randn(2, 64), step, cos, sin),  # more rows than the plan and write slots
             (hidden.to(torch.bfloat16), in_pool, cos, sin),
             (hidden, cpu_kernels.DecodeStep(plan, torch.tensor([5], dtype=torch.int32), runner.pool.k, runner.pool.v),
              cos, sin),
             (hidden, in_pool, torch.ones(1, 8), sin),
             (hidden, cpu_kernels.DecodeStep(plan, torch.tensor([5]), runner.pool.k[:, :, :1], runner.pool.v), cos,
              sin)]
    for arguments in wrong:
        with pytest.raises(ValueError):
            cpu_kernels.decode_layers(arguments[0], runner._fused.decoder_layers, *arguments[1:])
    assert torch.equal(runner.pool.k, before_k) and torch.equal(runner.pool.v, before_v)


@pytest.mark.skipif(not cpu_kernels.chunk_attention_runs(torch.bfloat16, 64),
                    reason="chunk attention needs a CPU with AMX-BF16 (and the CPU kernels built)")
def test_where_amx_attends_prefill_chunks_longer_steps_compute_in_float32_and_the_longest_keep_transformers_rounding():
    """A bf16 model whose chunks AMX attends (head_dim 64) takes steps of up to NATIVE_STEP_TOKENS_AMX tokens (the
    step that admits several requests on cached prompts) on the CPU kernels: their logits are the float32 forward's
    on the same weights within the bf16 rounding of the attention's queries and probabilities, closer than
    transformers' bf16 forward; a longer step keeps transformers' rounding bit for bit."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=300, hidden_size=256, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    model = LlamaForCausalLM(config).eval().to(torch.bfloat16)
    reference = LlamaForCausalLM(config).eval()
    reference.load_state_dict({name: tensor.float() for name, tensor in model.state_dict().items()})
    runners = {}
    for name, net, dtype, fused in (("kernels", model, torch.bfloat16, True), ("transformers", model, torch.bfloat16,
                                    False), ("float32", reference, torch.float32, True)):
        pool_config = ModelRunner.pool_config_for(net, torch.device("cpu"), dtype)
        runners[name] = ModelRunner(net, KVPool(pool_config, 1024), fused=fused)
    assert runners["kernels"].native_tokens == NATIVE_STEP_TOKENS_AMX
    generator = torch.Generator().manual_seed(4)
    cached = torch.randint(5, 300, (300,), generator=generator).tolist()
    table = torch.arange(1000)
    for runner in runners.values():
        runner.forward([ScheduledChunk(cached, table[:300], True)])
    chunk = torch.randint(5, 300, (NATIVE_STEP_TOKENS_AMX,), generator=generator).tolist()  # after the cached 300
    logits = {name: runner.forward([ScheduledChunk(chunk, table[: 300 + len(chunk)], True)])
              for name, runner in runners.items()}
    error = (logits["kernels"] - logits["float32"]).abs().max().item()  # measured 0.0027, transformers' 0.0058
    assert error <= 0.005 and error <= (logits["transformers"].float() - logits["float32"]).abs().max()
    longer = torch.randint(5, 300, (NATIVE_STEP_TOKENS_AMX + 1,), generator=generator).tolist()
    table = torch.arange(700)
    assert torch.equal(runners["kernels"].forward([ScheduledChunk(longer, table[: len(longer)], True)]),
                       runners["transformers"].forward([ScheduledChunk(longer, table[: len(longer)], True)]))
