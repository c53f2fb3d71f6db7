"""Decode steps replayed from captured graphs, one per padded batch size (CUDA graphs, as vLLM and SGLang do).

A decode-only step of `n` rows is padded up to the smallest capture size `S >= n` (`capture_sizes`: 1, 2, 4, 8, then
every multiple of 8 up to the largest batch); steps with more rows, a longer context than `max_context`, or prefill
chunks run eagerly. Each size owns static buffers, the only tensors its graph reads: the token ids, positions and
write slots `[S]`, and the page table of FlashInfer's decode kernel (`kv_indptr` `[S + 1]`, `kv_indices`
`[S * max_context]`, `last_page_len` `[S]`). A step copies its inputs into the first `n` rows; the padding rows read
and write one scratch slot of the pool, which no sequence owns (the engine's pool has one slot more than its
allocator hands out: `DecodeGraphSettings.scratch_slot`), so their results are discarded without a check on the
device. Everything a step copies is prepared on the host first, in a page-locked staging copy of the buffers when the
device is CUDA, and sent with `non_blocking` copies: a step never waits for the device between its start and the
read of its sampled tokens (the staging copy of a size is refilled only after the previous step's outputs were read
on the host, which the engine's loop does every step).

The graph of a size is captured on its first use (`capture(size, buffers)` returns what replays it; on CUDA,
`cuda_graph_capture`), after that step's inputs are in the buffers, then reused for every later step of that size;
`prepare(buffers, inputs)` runs on the host before every replay and before the capture (FlashInfer's `plan` over
the step's page table: local_engine.model.flashinfer_decode). local_engine.model.graph_step builds the captured
step (the model's forward over the buffers) and decides which steps take this path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Replay = Callable[[], torch.Tensor]  # runs the captured step; returns the static logits `[S, vocab]`


@dataclass(frozen=True)
class DecodeGraphSettings:
    """What captured decode steps need from the engine. `max_batch`: the most rows of a captured step (the scheduler's
    `max_num_seqs`); `max_context`: the most slots a row's slot table may hold (longer contexts run eagerly);
    `scratch_slot`: a pool slot no sequence owns, read and written by the padding rows."""

    max_batch: int
    max_context: int
    scratch_slot: int


def capture_sizes(max_batch: int) -> tuple[int, ...]:
    """The padded batch sizes graphs are captured for: 1, 2, 4, 8, then multiples of 8, up to `max_batch` (which is
    always one of them). Raises ValueError when `max_batch < 1`."""
    if max_batch < 1:
        raise ValueError("the largest decode batch must be at least 1")
    sizes = [size for size in (1, 2, 4) if size < max_batch]
    sizes += list(range(8, max_batch, 8))
    return tuple(sizes) + (max_batch,)


def padded_size(num_rows: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest of `sizes` (ascending) that holds `num_rows`, or None when none does (the step runs eagerly)."""
    for size in sizes:
        if size >= num_rows:
            return size
    return None


@dataclass
class DecodeBuffers:
    """The static inputs of one padded size `size` (all on the graph's device)."""

    size: int
    input_ids: torch.Tensor  # int64 [size]
    positions: torch.Tensor  # int64 [size]
    write_slots: torch.Tensor  # int64 [size]
    kv_indptr: torch.Tensor  # int32 [size + 1]
    kv_indices: torch.Tensor  # int32 [size * max_context]
    last_page_len: torch.Tensor  # int32 [size]

    @classmethod
    def allocate(cls, size: int, max_context: int, device: torch.device) -> DecodeBuffers:
        def zeros(n: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=device)

        return cls(size, zeros(size, torch.int64), zeros(size, torch.int64), zeros(size, torch.int64),
                   zeros(size + 1, torch.int32), zeros(size * max_context, torch.int32), zeros(size, torch.int32))


@dataclass(frozen=True)
class DecodeInputs:
    """One decode step's rows, on the host: `token_ids`, `positions` int64 `[n]`; `slot_tables[i]` int64, row i's
    slots up to and including its new token (whose slot is the last)."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    slot_tables: list[torch.Tensor]


class DecodeGraphs:
    """Captured decode steps by padded batch size, with the bookkeeping that pads a step and reuses its graph."""

    def __init__(self, max_batch: int, max_context: int, scratch_slot: int, device: torch.device,
                 capture: Callable[[int, DecodeBuffers], Replay],
                 prepare: Callable[[DecodeBuffers, dict[str, torch.Tensor]], None] | None = None) -> None:
        """`scratch_slot`: a pool slot no sequence owns (padding rows read and write it). `capture(size, buffers)`:
        captures the step over `buffers` and returns its replay. `prepare(buffers, inputs)`: host-side work before
        each replay (and before the capture), given the step's padded inputs on the host (see `host_inputs`).
        Raises ValueError when `max_batch < 1` or `max_context < 1`."""
        if max_context < 1:
            raise ValueError("max_context must be at least 1")
        self.sizes = capture_sizes(max_batch)
        self.max_context = max_context
        self.scratch_slot = scratch_slot
        self.device = device
        self._capture = capture
        self._prepare = prepare
        self._buffers: dict[int, tuple[DecodeBuffers, dict[str, torch.Tensor]]] = {}  # size -> buffers, staging
        self._replays: dict[int, Replay] = {}
        self.num_replays = 0

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self._replays))

    def fits(self, num_rows: int, longest_context: int) -> bool:
        """Whether a decode step of `num_rows` rows whose longest slot table has `longest_context` slots can replay a
        graph (else it runs eagerly)."""
        return num_rows >= 1 and padded_size(num_rows, self.sizes) is not None and longest_context <= self.max_context

    def host_inputs(self, step: DecodeInputs, size: int) -> dict[str, torch.Tensor]:
        """The step's inputs padded to `size` rows, built on the host (padding rows: token 0 at position 0 on the
        scratch slot, a context of that one slot). Keys: the names of DecodeBuffers' tensors; `kv_indices` holds
        only the slots in use (`kv_indptr[-1]` of them)."""
        n = len(step.slot_tables)
        pad = size - n
        scratch = torch.tensor([self.scratch_slot], dtype=torch.int64)
        tables = list(step.slot_tables) + [scratch] * pad
        lengths = torch.tensor([len(table) for table in tables], dtype=torch.int32)
        indptr = torch.zeros(size + 1, dtype=torch.int32)
        indptr[1:] = lengths.cumsum(0)
        zeros = torch.zeros(pad, dtype=torch.int64)
        return {
            "input_ids": torch.cat([step.token_ids, zeros]),
            "positions": torch.cat([step.positions, zeros]),
            "write_slots": torch.cat([torch.stack([table[-1] for table in step.slot_tables]), scratch.repeat(pad)]),
            "kv_indptr": indptr,
            "kv_indices": torch.cat(tables).to(torch.int32),
            "last_page_len": torch.ones(size, dtype=torch.int32),
        }

    def run(self, step: DecodeInputs) -> torch.Tensor:
        """Replay (capturing first if needed) the graph of the step's padded size; returns the logits of its `n` real
        rows, `[n, vocab]` (a view of the static output: read it before the next step). Raises ValueError when the
        step does not fit (see `fits`)."""
        n = len(step.slot_tables)
        if not self.fits(n, max(len(table) for table in step.slot_tables)):
            raise ValueError(f"a decode step of {n} rows does not fit the captured sizes {self.sizes}")
        size = padded_size(n, self.sizes)
        buffers, staging = self._buffers.get(size) or self._allocate(size)
        staged = {}
        for name, value in self.host_inputs(step, size).items():
            staged[name] = staging[name][: len(value)].copy_(value)
            getattr(buffers, name)[: len(value)].copy_(staged[name], non_blocking=True)
        if self._prepare is not None:
            self._prepare(buffers, staged)
        replay = self._replays.get(size)
        if replay is None:
            replay = self._replays[size] = self._capture(size, buffers)
        self.num_replays += 1
        return replay()[:n]

    def _allocate(self, size: int) -> tuple[DecodeBuffers, dict[str, torch.Tensor]]:
        buffers = DecodeBuffers.allocate(size, self.max_context, self.device)
        pin = self.device.type == "cuda"  # page-locked, so the copies to the device are asynchronous
        staging = {name: torch.empty(getattr(buffers, name).shape, dtype=getattr(buffers, name).dtype,
                                     pin_memory=pin) for name in _INPUTS}
        self._buffers[size] = (buffers, staging)
        return self._buffers[size]


_INPUTS = ("input_ids", "positions", "write_slots", "kv_indptr", "kv_indices", "last_page_len")


def cuda_graph_capture(step: Callable[[DecodeBuffers], torch.Tensor], warmup: int = 2
                       ) -> Callable[[int, DecodeBuffers], Replay]:
    """A `capture` for DecodeGraphs on CUDA: runs `step(buffers)` a few times on a side stream (so lazy
    initialisation is not captured), captures it in a `torch.cuda.CUDAGraph`, and replays that graph. The step runs
    over the buffers of the step being served, so the warm-up runs compute (and write) what its replay will.
    Capture errors are thread-local: other engine threads may use CUDA while the worker captures."""

    def capture(size: int, buffers: DecodeBuffers) -> Replay:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                step(buffers)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            output = step(buffers)

        def replay() -> torch.Tensor:
            graph.replay()
            return output

        return replay

    return capture
