"""Weights packed once for oneDNN give what `F.linear` gives: bit for bit up to EXACT_ROWS rows, and beyond them within
one bf16 rounding of each output (oneDNN may sum a long batch in another order for the two layouts)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from local_engine.model import cpu_kernels
from local_engine.model.packed_linear import EXACT_ROWS, PackedLinear, packs

_BF16_STEP = 2.0**-7  # one rounding step of bf16, relative to the value


def _same(a: torch.Tensor, b: torch.Tensor, rows: int) -> bool:
    if rows <= EXACT_ROWS:
        return torch.equal(a, b)
    # The two kernels' fp32 sums differ in their last bits, so a rounding to bf16 may fall one step apart.
    return bool(((a.float() - b.float()).abs() <= _BF16_STEP * b.float().abs() + 1e-4).all())


@pytest.mark.skipif(not packs(torch.zeros(1, dtype=torch.bfloat16)), reason="oneDNN computes no bf16 on this CPU")
@pytest.mark.parametrize("rows", [1, 2, 8, EXACT_ROWS, 33, 512])
def test_a_packed_bf16_weight_gives_f_linear_outputs(rows):
    generator = torch.Generator().manual_seed(rows)
    weight = (torch.randn(960, 576, generator=generator) * 0.05).to(torch.bfloat16)
    linear = PackedLinear(weight)
    assert linear.packed is not None and linear.out_features == 960
    for scale in (0.1, 1.0, 30.0):
        x = (torch.randn(rows, 576, generator=generator) * scale).to(torch.bfloat16)
        assert _same(linear(x), F.linear(x, weight), rows)
    x = torch.randn(1, rows, 576, generator=generator).to(torch.bfloat16)  # [batch, tokens, features]
    assert _same(linear(x), F.linear(x, weight), rows)


def test_float32_weights_are_not_packed():
    """A float32 weight goes through the CPU kernels for a few rows where they run (their own test checks their
    values), and through F.linear, bit for bit, for more rows or without them."""
    weight = torch.randn(64, 32)
    assert not packs(weight)
    linear = PackedLinear(weight)
    assert linear.packed is None and linear.native == cpu_kernels.available()
    many = torch.randn(cpu_kernels.MAX_ROWS + 1, 32)
    assert torch.equal(linear(many), F.linear(many, weight))
    few = torch.randn(3, 32)
    assert torch.allclose(linear(few), F.linear(few, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_without_the_cpu_kernels_any_rows_take_torch(monkeypatch, dtype):
    """No kernels built (or no AVX2): nothing calls them, not even for a step that wants no logits (0 rows)."""
    monkeypatch.setattr(cpu_kernels, "_module", lambda: None)
    weight = torch.randn(16, 8).to(dtype)
    linear = PackedLinear(weight)
    assert not linear.native
    for rows in (0, 1, 3):
        x = torch.randn(rows, 8).to(dtype)
        out = linear(x)
        assert out.shape == (rows, 16) and torch.equal(out, F.linear(x, weight))


@pytest.mark.skipif(not cpu_kernels.available(), reason="the CPU kernels are not built or do not run here")
def test_float32_rows_on_a_bf16_weight_come_back_in_float32_from_the_kernel_or_onednn():
    """A bf16 model's decode step on the CPU kernels: a few rows through the kernel, more through oneDNN's bf16 GEMM on
    rows rounded to bf16; float32 out either way, and bf16 rows keep the bf16 path bit for bit."""
    generator = torch.Generator().manual_seed(7)
    weight = (torch.randn(96, 64, generator=generator) * 0.1).to(torch.bfloat16)
    linear = PackedLinear(weight)
    native = cpu_kernels.max_rows(weight)
    assert linear.native_rows == native in (cpu_kernels.MAX_BF16_ROWS, cpu_kernels.MAX_BF16_ROWS_WIDE)
    for rows in sorted({1, native, native + 1, 9}):
        x = torch.randn(rows, 64, generator=generator)
        out = linear(x)
        exact = x.double() @ weight.double().T
        assert out.dtype == torch.float32 and out.shape == (rows, 96)
        tolerance = 1e-5 if rows <= native else 2 * _BF16_STEP * exact.abs().max().item()
        assert (out.double() - exact).abs().max().item() <= tolerance
    rounded = torch.randn(3, 64, generator=generator).to(torch.bfloat16)
    assert torch.equal(linear(rounded), F.linear(rounded, weight))
