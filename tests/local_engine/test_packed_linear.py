"""Weights packed once for oneDNN give what `F.linear` gives, bit for bit, for any number of rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from local_engine.model.packed_linear import PackedLinear, packs


@pytest.mark.skipif(not packs(torch.zeros(1, dtype=torch.bfloat16)), reason="oneDNN computes no bf16 on this CPU")
@pytest.mark.parametrize("rows", [1, 2, 8, 33])
def test_a_packed_bf16_weight_gives_f_linear_outputs_bit_for_bit(rows):
    generator = torch.Generator().manual_seed(rows)
    weight = (torch.randn(960, 576, generator=generator) * 0.05).to(torch.bfloat16)
    linear = PackedLinear(weight)
    assert linear.packed is not None and linear.out_features == 960
    for scale in (0.1, 1.0, 30.0):
        x = (torch.randn(rows, 576, generator=generator) * scale).to(torch.bfloat16)
        assert torch.equal(linear(x), F.linear(x, weight))
    x = torch.randn(1, rows, 576, generator=generator).to(torch.bfloat16)  # [batch, tokens, features]
    assert torch.equal(linear(x), F.linear(x, weight))


def test_float32_weights_are_not_packed():
    weight = torch.randn(64, 32)
    assert not packs(weight)
    linear = PackedLinear(weight)
    x = torch.randn(3, 32)
    assert linear.packed is None and torch.equal(linear(x), F.linear(x, weight))
