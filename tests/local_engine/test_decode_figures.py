"""The figures `prefixscope bench engine` sets beside its runs (the decode floor, bf16's greedy agreement) and the
`--dtype` choice they inform."""

from __future__ import annotations

import types

import pytest
import torch

from local_engine.bench.decode_floor import floor_section, floor_verdicts, read_bandwidth_gb_s, step_kv_tokens, \
    weight_bytes
from local_engine.bench.dtype_agreement import agreement
from local_engine.cache import KVPool
from local_engine.config import EngineConfig
from local_engine.model.loader import cpu_has_native_bf16, dtype_for
from local_engine.model.runner import ModelRunner

from .conftest import build_tiny_llama


def _cpuinfo(tmp_path, flags: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: fpu sse2 avx2 {flags}\n\n")
    return str(path)


def test_native_bf16_is_read_from_the_processor_flags(tmp_path):
    assert cpu_has_native_bf16(_cpuinfo(tmp_path, "avx512f avx512_bf16"))
    assert cpu_has_native_bf16(_cpuinfo(tmp_path, "amx_tile amx_bf16"))
    assert not cpu_has_native_bf16(_cpuinfo(tmp_path, "avx512f"))
    assert not cpu_has_native_bf16(str(tmp_path / "missing"))


def test_dtype_choice(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert dtype_for(cuda) == torch.bfloat16
    assert dtype_for(cpu, "float32") == torch.float32 and dtype_for(cuda, "float32") == torch.float32
    assert dtype_for(cpu, "bfloat16") == torch.bfloat16
    monkeypatch.setattr("local_engine.model.loader.cpu_has_native_bf16", lambda: True)
    assert dtype_for(cpu) == torch.bfloat16
    monkeypatch.setattr("local_engine.model.loader.cpu_has_native_bf16", lambda: False)
    assert dtype_for(cpu) == torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_for(cpu, "float16")


def test_dtype_is_an_engine_option():
    assert EngineConfig().dtype == "auto"


def test_agreement_counts_tokens_before_each_answers_first_difference():
    reference = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9]]
    other = [[1, 2, 3, 4], [5, 6, 0, 8], [0, 9]]
    result = agreement(reference, other)
    assert result == {"answers": 3, "identical_answers": 1, "tokens": 10, "share_before_first_difference": 0.6}


def test_the_floor_counts_weights_once_and_a_shared_prompt_once_per_step():
    model = build_tiny_llama(vocab_size=100, num_layers=2)
    params = sum(p.numel() for p in model.parameters()) * 4
    assert params <= weight_bytes(model) <= params + 4096  # tied or not, each storage once; rotary buffers are tiny
    config = ModelRunner.pool_config_for(model, torch.device("cpu"), torch.float32)
    engine = types.SimpleNamespace(loaded=types.SimpleNamespace(model=model), pool=KVPool(config, 16))
    runs = [
        {"concurrency": 1, "max_tokens": 32, "prompt_tokens_mean": 1000.0, "cached_tokens_mean": 990.0,
         "itl_p50_ms": 10.0},
        {"concurrency": 8, "max_tokens": 32, "prompt_tokens_mean": 1000.0, "cached_tokens_mean": 990.0,
         "itl_p50_ms": 20.0},
    ]
    # C=1: one prompt (990 shared + 10 own) and half the answer; C=8 over 4 prompts: each prompt once, 8 own parts.
    assert step_kv_tokens(runs[0], 4) == 990 + 10 + 16
    assert step_kv_tokens(runs[1], 4) == 4 * 990 + 8 * (10 + 16)
    section = floor_section(engine, runs, num_prefixes=4, bandwidth_gb_s=1.0)
    first = section["runs"][0]
    assert first["bytes_per_step"] == weight_bytes(model) + 1016 * config.bytes_per_token
    assert first["floor_ms"] == round(first["bytes_per_step"] / 1e9 * 1000, 2)
    assert first["itl_over_floor"] == pytest.approx(10.0 / first["floor_ms"], rel=0.01)
    verdicts = floor_verdicts(section)
    assert list(verdicts) == ["itl_over_floor_c1_max_tokens_32"]
    assert verdicts["itl_over_floor_c1_max_tokens_32"]["pass"] == (first["itl_over_floor"] <= 1.5)


def test_read_bandwidth_is_a_positive_rate():
    assert read_bandwidth_gb_s(torch.device("cpu"), num_bytes=1 << 22, passes=2) > 0


def test_teacher_forced_share_is_one_for_the_models_own_greedy_answers(tiny_loaded):
    from local_engine.bench.dtype_agreement import teacher_forced_share
    from local_engine.model.runner import ScheduledChunk

    model = tiny_loaded.model
    runner = ModelRunner(model, KVPool(ModelRunner.pool_config_for(model, torch.device("cpu"), torch.float32), 64))
    prompts, answers = [[5, 6, 7, 8], [9, 10]], []
    for prompt in prompts:
        tokens = list(prompt)
        for _ in range(5):
            logits = runner.forward([ScheduledChunk(tokens, torch.arange(len(tokens)), True)])
            tokens.append(int(logits[0].argmax()))
        answers.append(tokens[len(prompt) :])
    assert teacher_forced_share(tiny_loaded, prompts, answers) == 1.0
    wrong = [answer[:-1] + [(answer[-1] + 1) % 100] for answer in answers]
    assert teacher_forced_share(tiny_loaded, prompts, wrong) == 0.8
