"""The CPU kernels are declared torch operators: a call with the wrong tensors raises a ValueError naming them before
any memory is touched, the schema refuses wrong argument types, fake tensors run the checks alone, and torch's
profiler shows the ops by name. A build from other sources than those shipped is refused, with the reason logged."""

from __future__ import annotations

import logging

import pytest
import torch
from torch._subclasses import FakeTensorMode

from local_engine.model import cpu_kernels, kernel_extension

OPS = ("linear", "rms_norm", "rotate", "silu_mul", "decode_attention", "chunk_attention", "store", "decode_layers")
needs_kernels = pytest.mark.skipif(not cpu_kernels.available(), reason="the CPU kernels are not built or do not run "
                                   "here")


def test_every_kernel_is_a_declared_op_whose_schema_names_what_it_writes():
    schemas = {name: str(getattr(torch.ops.prefixscope, name).default._schema) for name in OPS}
    assert "Tensor(a2!) out" in schemas["linear"] and "Tensor weight," in schemas["linear"]
    assert "Tensor(a0!) qkv" in schemas["rotate"]
    assert "Tensor(a0!) pool_layer" in schemas["store"]
    assert all(f"Tensor(a{i}!) {name}" in schemas["decode_layers"] for i, name in ((0, "hidden"), (2, "pool_k"),
                                                                                    (3, "pool_v")))
    assert all(schema.endswith("-> ()") for schema in schemas.values())  # outputs are written, never returned


def test_the_schema_refuses_arguments_of_the_wrong_type_before_the_checks():
    with pytest.raises(RuntimeError, match="Expected a value of type 'Tensor' for argument 'weight'"):
        torch.ops.prefixscope.linear.default(torch.zeros(1, 8), 3, torch.zeros(1, 1))


@pytest.mark.parametrize(
    ("x", "weight", "message"),
    [
        (torch.zeros(2, 31), torch.zeros(8, 32), "x has 31 features, the weight 32"),
        (torch.zeros(2, 32, dtype=torch.float64), torch.zeros(8, 32), "x: a contiguous float32 CPU matrix"),
        (torch.zeros(32, 2).t(), torch.zeros(8, 32), "x: a contiguous float32 CPU matrix"),
        (torch.zeros(2, 32), torch.zeros(32, 8).t(), "weight: a contiguous float32 or bfloat16 CPU tensor"),
        (torch.zeros(2, 32), torch.zeros(8, 32, dtype=torch.float16), "weight: a contiguous float32 or bfloat16"),
    ],
)
def test_a_matmul_of_the_wrong_tensors_is_refused_naming_them(x, weight, message):
    """Whether the kernels run here or not: the checks come before the launch (on fake tensors too)."""
    with pytest.raises(ValueError, match=message):
        cpu_kernels.linear(x, weight)
    with FakeTensorMode() as mode, pytest.raises(ValueError, match=message):
        cpu_kernels.linear(mode.from_tensor(x), mode.from_tensor(weight))


def test_on_fake_tensors_the_ops_check_shapes_and_run_nothing():
    with FakeTensorMode():
        out = cpu_kernels.linear(torch.randn(3, 64), torch.randn(16, 64, dtype=torch.bfloat16))
        assert out.shape == (3, 16) and out.dtype == torch.float32
        assert cpu_kernels.silu_mul(torch.randn(2, 10)).shape == (2, 5)
        with pytest.raises(ValueError, match="gate_up .*: an odd width"):
            cpu_kernels.silu_mul(torch.randn(2, 9))


@needs_kernels
def test_a_store_of_the_wrong_tensors_writes_nothing():
    pool = torch.zeros(8, 2, 16)
    with pytest.raises(ValueError, match="cannot store rows"):
        cpu_kernels.store(pool, torch.tensor([1, 2]), torch.ones(2, 3, 16))  # 3 KV heads into a pool of 2
    with pytest.raises(ValueError, match="slots: a contiguous int64"):
        cpu_kernels.store(pool, torch.tensor([1, 2], dtype=torch.int32), torch.ones(2, 2, 16))
    with pytest.raises(ValueError, match="pool_layer: a contiguous float32 or bfloat16"):
        cpu_kernels.store(pool.double(), torch.tensor([1, 2]), torch.ones(2, 2, 16))
    assert not pool.any()


@needs_kernels
def test_a_decode_plan_that_reads_outside_its_tables_or_the_pool_is_refused():
    pool = torch.randn(64, 1, 16)
    query = torch.randn(1, 2, 16)
    plan = cpu_kernels.plan_decode([torch.arange(10)], [])
    assert torch.isfinite(cpu_kernels.decode_attention(query, pool, pool, plan, 0.25)).all()
    outside_pool = cpu_kernels.plan_decode([torch.tensor([1, 2, 64])], [])
    past_table = cpu_kernels.DecodePlan(plan.slots, plan.segments.clone(), plan.segment_rows)
    past_table.segments[0, 2] = 11  # the end position, past a table of 10
    other_row = cpu_kernels.DecodePlan(plan.slots, plan.segments.clone(), plan.segment_rows)
    other_row.segments[0, 0] = 1  # a table row the plan does not have
    for bad in (outside_pool, past_table, other_row):
        with pytest.raises(IndexError, match="the decode plan reads outside"):
            cpu_kernels.decode_attention(query, pool, pool, bad, 0.25)
    with pytest.raises(ValueError, match="plan segments: a contiguous int64"):
        cpu_kernels.decode_attention(query, pool, pool, cpu_kernels.DecodePlan(
            plan.slots, plan.segments.to(torch.int32), plan.segment_rows), 0.25)
    with pytest.raises(ValueError, match="cannot attend a pool layer"):
        cpu_kernels.decode_attention(torch.randn(1, 2, 8), pool, pool, plan, 0.25)


@needs_kernels
def test_the_ops_show_in_the_profiler_by_name():
    x, weight = torch.randn(2, 32), torch.randn(8, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        cpu_kernels.rms_norm(cpu_kernels.linear(x, weight), torch.ones(8), 1e-5)
    names = {event.name for event in profile.events()}
    assert {"prefixscope::linear", "prefixscope::rms_norm"} <= names


def test_the_source_hash_follows_every_c_and_header_file(tmp_path):
    (tmp_path / "a.c").write_text("int a;\n")
    (tmp_path / "a.h").write_text("#define A 1\n")
    (tmp_path / "notes.txt").write_text("not a source")
    first = kernel_extension.source_hash(tmp_path)
    assert first is not None and len(first) == 16
    (tmp_path / "notes.txt").write_text("still not a source")
    assert kernel_extension.source_hash(tmp_path) == first
    (tmp_path / "a.h").write_text("#define A 2\n")
    assert kernel_extension.source_hash(tmp_path) != first
    assert kernel_extension.source_hash(tmp_path / "missing") is None


def test_the_built_extension_carries_the_hash_of_the_sources_shipped():
    """`pip install -e .` compiles the hash in; a build without it never loads (csrc/module.c)."""
    try:
        from local_engine.model import _cpu_kernels
    except ImportError:
        pytest.skip("the CPU kernels are not built")
    assert _cpu_kernels.SOURCE_HASH == kernel_extension.source_hash() or not cpu_kernels.available()
    assert _cpu_kernels.PATH_NAMES == kernel_extension.KERNEL_PATHS


@pytest.fixture
def fresh_extension():
    """extension() loads and checks again in the test, and once more after it."""
    kernel_extension.extension.cache_clear()
    yield
    kernel_extension.extension.cache_clear()


def test_a_build_from_other_sources_is_refused_with_the_reason_logged(fresh_extension, monkeypatch, caplog):
    try:
        from local_engine.model import _cpu_kernels  # noqa: F401
    except ImportError:
        pytest.skip("the CPU kernels are not built")
    monkeypatch.setattr(kernel_extension, "source_hash", lambda directory=None: "0123456789abcdef")
    with caplog.at_level(logging.WARNING, logger=kernel_extension.__name__):
        assert kernel_extension.extension()[0] is None
    assert not cpu_kernels.available()
    reason = kernel_extension.extension()[1]  # cpu_kernels.unavailable_reason() too, unless they are switched off
    assert "the build is stale" in reason and "0123456789abcdef" in reason
    assert any("the build is stale" in record.getMessage() for record in caplog.records)
    with pytest.raises(RuntimeError, match="prefixscope::linear: the CPU kernels do not run here: the build is stale"):
        cpu_kernels.linear(torch.randn(1, 32), torch.randn(4, 32))
    assert kernel_extension.path_counts()["matmul_256"] == 0  # nothing of a refused build ran or is read
