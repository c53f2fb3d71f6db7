"""Decode steps through captured graphs in ModelRunner: which steps take that path, and that it computes what the eager
path computes. On the CPU the step over the static buffers runs with an eager "capture" (a replay runs the step
again) and SDPA over the static page table; on CUDA with FlashInfer, the same checks with real CUDA graphs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from local_engine.cache import KVPool, SlotAllocator
from local_engine.config import EngineConfig
from local_engine.model.decode_graphs import DecodeGraphSettings
from local_engine.model.graph_step import eager_graph_backend
from local_engine.model.runner import ModelRunner, ScheduledChunk

from .conftest import build_tiny_llama

VOCAB = 300
NUM_SLOTS = 512  # the allocator's; the pool has one more, the scratch slot


def _runners(model, *, max_batch: int = 8, max_context: int = 64, fused: bool = True, device: str = "cpu",
             dtype: torch.dtype = torch.float32, **graphed_options) -> tuple[ModelRunner, ModelRunner]:
    """An eager runner and a graphed one over the same model, each with its own pool."""
    config = ModelRunner.pool_config_for(model, torch.device(device), dtype)
    options = {"graph_backend": eager_graph_backend()} if device == "cpu" else {"attention_backend": "flashinfer"}
    options.update(graphed_options)
    settings = DecodeGraphSettings(max_batch, max_context, scratch_slot=NUM_SLOTS)
    eager = ModelRunner(model, KVPool(config, NUM_SLOTS + 1), fused=fused,
                        **({} if device == "cpu" else {"attention_backend": "flashinfer"}))
    graphed = ModelRunner(model, KVPool(config, NUM_SLOTS + 1), fused=fused, decode_graphs=settings, **options)
    return eager, graphed


class Sequences:
    """Prompts prefilled in both runners, then decoded a token at a time on scattered slots."""

    def __init__(self, runners: tuple[ModelRunner, ...], lengths: list[int], seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        allocator = SlotAllocator(NUM_SLOTS)
        self.runners = runners
        self.tables = [allocator.alloc(n + 20)[torch.randperm(n + 20, generator=generator)] for n in lengths]
        prompts = [torch.randint(5, VOCAB, (n,), generator=generator).tolist() for n in lengths]
        self.next_tokens = [prompt[-1] for prompt in prompts]
        for runner in runners:
            runner.forward([ScheduledChunk(p[:-1], t[: len(p) - 1], False) for p, t in zip(prompts, self.tables)])
        self.lengths = [n - 1 for n in lengths]  # tokens in the pool; the prompts' last tokens are decoded first

    def chunks(self, rows: list[int]) -> list[ScheduledChunk]:
        return [ScheduledChunk([self.next_tokens[i]], self.tables[i][: self.lengths[i] + 1], True) for i in rows]

    def advance(self, rows: list[int], logits: torch.Tensor) -> None:
        for i, row_logits in zip(rows, logits):
            self.lengths[i] += 1
            self.next_tokens[i] = int(row_logits.argmax())


@pytest.mark.model_forward
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "transformers"])
def test_graphed_decode_steps_give_the_eager_logits_and_capture_each_size_once(fused):
    model = build_tiny_llama(VOCAB, seed=5)
    eager, graphed = _runners(model, fused=fused)
    sequences = Sequences((eager, graphed), [30, 9, 51, 17, 4])
    graphs = graphed.graphed.graphs
    for rows in ([0], [0, 1, 2], [0, 1, 2, 3, 4], [1, 3, 4], [2]):
        chunks = sequences.chunks(rows)
        expected, got = eager.forward(chunks), graphed.forward(chunks)
        assert got.shape == (len(rows), VOCAB) and got.dtype == torch.float32
        assert (got - expected).abs().max().item() <= 1e-4
        sequences.advance(rows, expected)
    # Steps of 1, 3, 5, 3 and 1 rows: sizes 1, 4 and 8, each captured on its first use and replayed after.
    assert graphed.graphed.capture.captured == [1, 4, 8]
    assert graphs.captured_sizes == (1, 4, 8) and graphs.num_replays == 5
    # Both pools hold the same K/V for every slot a sequence owns.
    owned = torch.cat([table[:n] for table, n in zip(sequences.tables, sequences.lengths)])
    for name in ("k", "v"):
        a, b = getattr(eager.pool, name), getattr(graphed.pool, name)
        assert (a[:, owned] - b[:, owned]).abs().max().item() <= 1e-5


def test_a_graphed_step_writes_only_its_rows_write_slots_and_the_scratch_slot():
    model = build_tiny_llama(VOCAB, seed=6)
    eager, graphed = _runners(model)
    sequences = Sequences((eager, graphed), [12, 20, 7])
    before_k, before_v = graphed.pool.k.clone(), graphed.pool.v.clone()
    rows = [0, 1, 2]  # padded to 4: one padding row
    chunks = sequences.chunks(rows)
    graphed.forward(chunks)
    changed = ((graphed.pool.k != before_k) | (graphed.pool.v != before_v)).flatten(2).any(dim=2).any(dim=0)
    written = {int(chunk.slot_table[-1]) for chunk in chunks}
    assert set(changed.nonzero().flatten().tolist()) == written | {NUM_SLOTS}
    # Padding rows attend only the scratch slot: the real rows' logits are the eager path's.
    assert (graphed.forward(chunks) - eager.forward(chunks)).abs().max().item() <= 1e-4


def test_steps_that_do_not_fit_run_eagerly():
    model = build_tiny_llama(VOCAB, seed=7)
    eager, graphed = _runners(model, max_batch=4, max_context=40)
    sequences = Sequences((eager, graphed), [10, 12, 14, 16, 45])
    graphs = graphed.graphed.graphs
    prompt_tail = ScheduledChunk([7, 8], sequences.tables[0][:2], True)
    eager_steps = {
        "more rows than the largest size": sequences.chunks([0, 1, 2, 3, 4]),
        "a context longer than max_context": sequences.chunks([4]),
        "a prefill chunk": sequences.chunks([1]) + [prompt_tail],
        "all_logits": [ScheduledChunk([9], sequences.tables[1][:13], True, all_logits=True)],
        "a chunk that wants no logits": [ScheduledChunk([9], sequences.tables[1][:13], False)],
    }
    for reason, chunks in eager_steps.items():
        assert graphed.graphed.inputs_of(chunks) is None, reason
        expected, got = eager.run(chunks), graphed.run(chunks)
        torch.testing.assert_close(got.logits, expected.logits, atol=1e-4, rtol=0, msg=reason)
        assert got.chunk_logits.keys() == expected.chunk_logits.keys(), reason
        for index, logits in expected.chunk_logits.items():
            torch.testing.assert_close(got.chunk_logits[index], logits, atol=1e-4, rtol=0, msg=reason)
    assert graphs.num_replays == 0 and graphs.captured_sizes == ()
    assert graphed.graphed.inputs_of(sequences.chunks([0, 1, 2, 3])) is not None


def test_enforce_eager_and_devices_without_flashinfer_run_every_step_eagerly():
    model = build_tiny_llama(VOCAB, seed=8)
    config = ModelRunner.pool_config_for(model, torch.device("cpu"), torch.float32)
    settings = DecodeGraphSettings(8, 64, scratch_slot=NUM_SLOTS)
    forced = ModelRunner(model, KVPool(config, NUM_SLOTS + 1), decode_graphs=settings, enforce_eager=True,
                         graph_backend=eager_graph_backend())
    assert forced.graphed is None
    # On the CPU there are no CUDA graphs: the graph path runs only with an explicit backend.
    assert ModelRunner(model, KVPool(config, NUM_SLOTS + 1), decode_graphs=settings).graphed is None
    with pytest.raises(ValueError, match="scratch slot"):
        ModelRunner(model, KVPool(config, NUM_SLOTS), decode_graphs=settings, graph_backend=eager_graph_backend())


def test_the_engine_keeps_a_scratch_slot_and_passes_enforce_eager_on(tiny_loaded):
    from local_engine.engine.engine import Engine

    engine = Engine(EngineConfig(device="cpu", kv_cache_tokens=256, enforce_eager=True), tiny_loaded)
    assert engine.pool.num_slots == engine.allocator.num_slots + 1 == 257
    allocated = engine.allocator.alloc(256)
    assert allocated is not None and 256 not in allocated.tolist()
    assert engine.runner.graphed is None


def test_importing_the_graph_modules_does_not_import_flashinfer():
    code = ("import sys, local_engine.model.runner, local_engine.model.flashinfer_decode, "
            "local_engine.engine.engine; assert 'flashinfer' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (the CPU tests above "
                    "cover the bookkeeping and the step)")
def test_cuda_graphs_with_flashinfer_give_the_eager_logits():
    pytest.importorskip("flashinfer")
    model = build_tiny_llama(VOCAB, seed=9).to("cuda", torch.bfloat16)
    eager, graphed = _runners(model, device="cuda", dtype=torch.bfloat16)
    sequences = Sequences((eager, graphed), [30, 9, 51, 17, 4])
    for rows in ([0], [0, 1, 2], [0, 1, 2, 3, 4], [1, 3, 4]):
        chunks = sequences.chunks(rows)
        expected, got = eager.forward(chunks), graphed.forward(chunks)
        torch.testing.assert_close(got, expected, atol=3e-2, rtol=3e-2)
        sequences.advance(rows, expected)
    assert graphed.graphed.graphs.captured_sizes == (1, 4, 8) and graphed.graphed.graphs.num_replays == 4
