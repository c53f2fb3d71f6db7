"""The bookkeeping of captured decode steps (padding to a few batch sizes, one capture per size, reuse), run on the
CPU with a capture that replays eagerly over the same static buffers a CUDA graph would read."""

from __future__ import annotations

import pytest
import torch

from local_engine.model.decode_graphs import DecodeBuffers, DecodeGraphs, DecodeInputs, capture_sizes, padded_size

SCRATCH = 999


def test_capture_sizes_and_padding():
    assert capture_sizes(32) == (1, 2, 4, 8, 16, 24, 32)
    assert capture_sizes(12) == (1, 2, 4, 8, 12)
    assert capture_sizes(1) == (1,)
    sizes = capture_sizes(32)
    assert [padded_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 17, 32)] == [1, 2, 4, 8, 8, 16, 24, 32]
    assert padded_size(33, sizes) is None
    with pytest.raises(ValueError):
        capture_sizes(0)


class EagerCapture:
    """Stands in for a CUDA graph: the 'step' reads only the static buffers and writes one static output."""

    def __init__(self) -> None:
        self.captured: list[int] = []

    def __call__(self, size: int, buffers: DecodeBuffers):
        self.captured.append(size)
        output = torch.zeros(size, 4)

        def replay() -> torch.Tensor:
            contexts = (buffers.kv_indptr[1:] - buffers.kv_indptr[:-1]).float()
            sums = torch.stack([buffers.kv_indices[int(a) : int(b)].sum() for a, b in
                                zip(buffers.kv_indptr[:-1], buffers.kv_indptr[1:])]).float()
            output.copy_(torch.stack([buffers.input_ids.float(), buffers.positions.float(),
                                      buffers.write_slots.float(), contexts + sums / 1e6], dim=1))
            return output

        return replay


def _step(rows: int, base: int) -> DecodeInputs:
    tables = [torch.arange(base + 10 * row, base + 10 * row + 3 + row) for row in range(rows)]
    return DecodeInputs(torch.arange(100, 100 + rows), torch.tensor([len(t) - 1 for t in tables]), tables)


def test_a_step_is_padded_to_its_size_and_the_graph_of_that_size_is_captured_once_and_reused():
    capture = EagerCapture()
    graphs = DecodeGraphs(max_batch=8, max_context=64, scratch_slot=SCRATCH, device=torch.device("cpu"),
                          capture=capture)
    for rows, base in ((3, 0), (3, 200), (4, 400), (1, 600), (7, 0)):
        step = _step(rows, base)
        out = graphs.run(step)
        assert out.shape == (rows, 4)
        for row, table in enumerate(step.slot_tables):
            assert out[row, 0] == 100 + row and out[row, 1] == len(table) - 1 and out[row, 2] == table[-1]
            assert out[row, 3].item() == pytest.approx(len(table) + table.sum().item() / 1e6)
    assert capture.captured == [4, 1, 8]
    assert graphs.captured_sizes == (1, 4, 8) and graphs.num_replays == 5


def test_padding_rows_read_and_write_only_the_scratch_slot():
    graphs = DecodeGraphs(8, 64, SCRATCH, torch.device("cpu"), EagerCapture())
    inputs = graphs.host_inputs(_step(3, 0), 4)
    assert inputs["write_slots"].tolist()[3] == SCRATCH
    assert inputs["kv_indptr"].tolist() == [0, 3, 7, 12, 13]
    assert inputs["kv_indices"].tolist()[-1] == SCRATCH
    assert inputs["input_ids"].tolist()[3] == 0 and inputs["positions"].tolist()[3] == 0
    assert inputs["last_page_len"].tolist() == [1, 1, 1, 1]


def test_steps_beyond_the_captured_sizes_or_context_run_eagerly():
    graphs = DecodeGraphs(8, 3, SCRATCH, torch.device("cpu"), EagerCapture())
    assert graphs.fits(8, 3) and not graphs.fits(9, 3) and not graphs.fits(2, 4) and not graphs.fits(0, 1)
    with pytest.raises(ValueError):
        graphs.run(_step(2, 0))  # row 1 has a context of 4 slots


def test_prepare_runs_on_the_host_before_the_capture_and_before_every_replay():
    events: list[tuple[str, int]] = []
    capture = EagerCapture()

    def prepare(buffers: DecodeBuffers, inputs: dict[str, torch.Tensor]) -> None:
        # The step's inputs are in the buffers already; the plan reads the host copy of its page table.
        assert inputs["kv_indptr"].device.type == "cpu"
        assert torch.equal(buffers.kv_indptr, inputs["kv_indptr"])
        assert torch.equal(buffers.kv_indices[: len(inputs["kv_indices"])], inputs["kv_indices"])
        events.append(("prepare", buffers.size))

    def record_capture(size: int, buffers: DecodeBuffers):
        events.append(("capture", size))
        return capture(size, buffers)

    graphs = DecodeGraphs(8, 64, SCRATCH, torch.device("cpu"), record_capture, prepare)
    for rows in (3, 4, 1):
        graphs.run(_step(rows, 0))
    assert events == [("prepare", 4), ("capture", 4), ("prepare", 4), ("prepare", 1), ("capture", 1)]
