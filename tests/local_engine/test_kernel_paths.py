"""Which CPU kernel path served a step, checked against the CPU's own flags in both directions: a prefill chunk of a
bf16 pool is attended on AMX exactly where /proc/cpuinfo shows AMX (and the kernels run), a bf16 matmul takes the
512-bit path exactly where it shows AVX-512F and BW; and with the kernels switched off every step runs on torch.

CI runs this file a second time with PREFIXSCOPE_CPU_KERNELS=off (the `model_forward` subset, Makefile `test`)."""

from __future__ import annotations

import os

import pytest
import torch

from local_engine.cache import KVPool
from local_engine.config import EngineConfig
from local_engine.model import cpu_kernels, kernel_extension
from local_engine.model.runner import ModelRunner, ScheduledChunk

from .conftest import build_tiny_llama

pytestmark = pytest.mark.model_forward


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return set(next(line for line in cpuinfo if line.startswith("flags")).split())
    except (OSError, StopIteration):
        return set()


FLAGS = _cpu_flags()
HAS_AMX = {"amx_bf16", "amx_tile", "avx512_bf16", "avx512vl", "avx512f", "avx512bw"} <= FLAGS
HAS_AVX512 = {"avx512f", "avx512bw"} <= FLAGS


def _bf16_llama(head_dim: int = 64):
    """A tiny bf16 Llama whose head_dim chunk attention takes (a multiple of 32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=2 * head_dim, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim)
    return LlamaForCausalLM(config).eval().to(torch.bfloat16)


def _runner(model, dtype: torch.dtype, **options) -> ModelRunner:
    config = ModelRunner.pool_config_for(model, torch.device("cpu"), dtype)
    return ModelRunner(model, KVPool(config, 512), **options)


@pytest.fixture
def kernels_mode(monkeypatch):
    """`cpu_kernels.set_mode`; afterwards the environment as it was and the switch back to auto (which reads it)."""
    yield cpu_kernels.set_mode
    monkeypatch.undo()
    cpu_kernels.set_mode("auto")


def test_the_path_counters_name_every_path_and_start_from_the_extensions_own():
    counts = cpu_kernels.path_counts()
    assert set(counts) == {*kernel_extension.KERNEL_PATHS, kernel_extension.TORCH_PATH}
    assert all(isinstance(count, int) and count >= 0 for count in counts.values())


def test_a_prefill_chunk_is_attended_on_amx_exactly_where_the_cpu_flags_show_amx():
    runner = _runner(_bf16_llama(), torch.bfloat16)
    before = cpu_kernels.path_counts()
    runner.forward([ScheduledChunk(list(range(5, 45)), torch.arange(40), True)])
    ran = cpu_kernels.paths_since(before)
    expected = HAS_AMX and cpu_kernels.available()
    assert (ran.get("amx_chunk_attention", 0) == 2) == expected, (ran, sorted(FLAGS & {"amx_bf16", "amx_tile"}))
    assert ("amx_chunk_attention" in ran) == expected


def test_a_bf16_matmul_takes_the_512_bit_path_exactly_where_the_cpu_flags_show_avx512():
    weight = torch.randn(16, 128).to(torch.bfloat16)
    before = cpu_kernels.path_counts()
    if not cpu_kernels.available():
        assert not cpu_kernels.runs(weight)
        return
    cpu_kernels.linear(torch.randn(2, 128), weight)
    assert cpu_kernels.paths_since(before) == ({"matmul_512": 1} if HAS_AVX512 else {"matmul_256": 1})
    before = cpu_kernels.path_counts()
    cpu_kernels.linear(torch.randn(2, 128), weight.float())  # float32 weights: the 256-bit path everywhere
    assert cpu_kernels.paths_since(before) == {"matmul_256": 1}


def test_a_bf16_decode_step_runs_every_layer_in_one_call_on_the_cpus_widest_matmul():
    runner = _runner(_bf16_llama(), torch.bfloat16)
    runner.forward([ScheduledChunk(list(range(5, 25)), torch.arange(20), True)])
    before = cpu_kernels.path_counts()
    runner.forward([ScheduledChunk([7], torch.arange(21), True)])
    ran = cpu_kernels.paths_since(before)
    if not cpu_kernels.available():
        assert ran == {"torch": 1}
        return
    wide, narrow = ("matmul_512", "matmul_256") if HAS_AVX512 else ("matmul_256", "matmul_512")
    # 2 layers of 4 matmuls in the one call, then the head.
    assert ran.get("decode_layers") == 1 and ran.get(wide) == 2 * 4 + 1 and narrow not in ran and "torch" not in ran


def test_switched_off_every_step_runs_on_torch_and_computes_the_same_logits(kernels_mode):
    model = build_tiny_llama(vocab_size=300, seed=4)
    prompt, table = list(range(5, 35)), torch.arange(40)
    on = _runner(model, torch.float32).forward([ScheduledChunk(prompt, table[:30], True)])
    off_runner = _runner(model, torch.float32, cpu_kernels_mode="off")
    assert not cpu_kernels.available() and cpu_kernels.unavailable_reason() is not None
    assert not off_runner._fused.native and off_runner._fused.decoder_layers is None
    before = cpu_kernels.path_counts()
    off = off_runner.forward([ScheduledChunk(prompt, table[:30], True)])
    off_runner.forward([ScheduledChunk([9], table[:31], True)])
    assert cpu_kernels.paths_since(before) == {"torch": 2}
    assert (on - off).abs().max().item() <= 1e-4
    kernels_mode("auto")
    assert cpu_kernels.available() == (kernel_extension.off_reason() is None
                                       and kernel_extension.extension()[0] is not None)


def test_the_environment_switches_them_off_whatever_the_mode(monkeypatch, kernels_mode):
    monkeypatch.setenv(kernel_extension.ENV_VAR, "off")
    kernels_mode("auto")
    assert not cpu_kernels.available() and cpu_kernels.unavailable_reason() == "PREFIXSCOPE_CPU_KERNELS=off"
    assert cpu_kernels.max_rows(torch.zeros(4, 8)) == 0 and not cpu_kernels.attends(torch.zeros(4, 1, 16))
    monkeypatch.setenv(kernel_extension.ENV_VAR, "of")  # a typo leaves them off too: torch is never wrong
    kernels_mode("auto")
    assert not cpu_kernels.available() and "neither auto nor off" in cpu_kernels.unavailable_reason()
    with pytest.raises(ValueError, match="choose one of auto, off"):
        kernels_mode("no")


def test_ci_runs_this_subset_with_the_kernels_off_where_the_environment_says_so():
    if os.environ.get(kernel_extension.ENV_VAR) != "off":
        pytest.skip("the run with the CPU kernels on")
    assert not cpu_kernels.available() and cpu_kernels.unavailable_reason() == "PREFIXSCOPE_CPU_KERNELS=off"


def test_the_engine_option_sets_the_switch(kernels_mode, tiny_loaded):
    from local_engine.engine.engine import Engine

    assert EngineConfig().cpu_kernels == "auto"
    engine = Engine(EngineConfig(cpu_kernels="off", kv_cache_tokens=256), tiny_loaded)
    assert not cpu_kernels.available() and not engine.runner._fused.native


def test_the_engine_benchmark_reports_the_paths_its_measured_steps_ran(tiny_loaded):
    from local_engine.bench.engine import _measure
    from local_engine.engine.engine import Engine

    prompt = list(range(5, 45))
    config = EngineConfig(kv_cache_tokens=512, batch_invariant=False)  # the paths counted here
    section = _measure(Engine(config, tiny_loaded), [(True, prompt), (False, prompt)], 3, "paths")
    paths = section["cpu_kernel_paths"]
    if cpu_kernels.available():  # 40-token prompts and decode steps, all on the kernels: 2 requests of 2 decode steps
        assert paths.get("decode_layers", 0) >= 4 and paths.get("matmul_256", 0) > 0 and "torch" not in paths
    else:
        assert set(paths) == {"torch"} and paths["torch"] >= 6
