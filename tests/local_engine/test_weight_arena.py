"""The weight arena hands out aligned, independent copies until it is full, and the fused forward's matmul weights
live in one."""

from __future__ import annotations

import pytest
import torch

from local_engine.model import cpu_kernels
from local_engine.model.fused_llama import FusedLlamaForward
from local_engine.model.weight_arena import WeightArena



def test_copies_are_aligned_equal_and_independent_until_the_arena_is_full():
    sources = [torch.randn(3, 5), torch.randn(7).to(torch.bfloat16), torch.arange(11, dtype=torch.int64)]
    arena = WeightArena(WeightArena.size_for(sources))
    copies = [arena.take(source) for source in sources]
    for source, copy in zip(sources, copies):
        assert torch.equal(copy, source) and copy.dtype == source.dtype and copy.is_contiguous()
        assert copy.data_ptr() % 64 == 0 and copy.data_ptr() != source.data_ptr()
    copies[0].zero_()
    assert torch.equal(copies[1], sources[1]) and torch.equal(copies[2], sources[2])  # no overlap
    with pytest.raises(MemoryError):
        arena.take(torch.randn(64))
    with pytest.raises(ValueError):
        WeightArena(0)


@pytest.mark.skipif(not cpu_kernels.available(), reason="the CPU kernels are not built or do not run here")
@pytest.mark.parametrize("tied", [False, True])
def test_the_fused_forwards_matmul_weights_live_in_one_arena_and_the_model_still_uses_them(tied):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(8)
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    model = LlamaForCausalLM(config).eval()
    assert (model.model.embed_tokens.weight is model.lm_head.weight) == tied
    ids = torch.randint(3, 100, (1, 12))
    before = model(ids).logits
    forward = FusedLlamaForward.of(model)
    arena = forward.lm_head.weight.untyped_storage().data_ptr()
    weights = [forward.lm_head.weight] + [linear.weight for layer in forward.layers
                                          for linear in (layer.qkv, layer.gate_up, layer.o, layer.down)]
    assert all(weight.untyped_storage().data_ptr() == arena for weight in weights)
    assert (model.model.embed_tokens.weight is model.lm_head.weight) == tied
    attn = model.model.layers[1].self_attn
    assert attn.o_proj.weight.data_ptr() == forward.layers[1].o.weight.data_ptr()
    assert torch.equal(model(ids).logits, before)
