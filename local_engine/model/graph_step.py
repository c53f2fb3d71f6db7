"""Which steps replay a captured decode graph, and the step a graph captures.

A step takes this path when every chunk is one token that wants its logits (a decode row, or a prompt's last token)
and none asks for `all_logits`, and the rows fit the captured sizes and context (`DecodeGraphs.fits`); every other
step runs eagerly (`GraphedDecode.inputs_of` returns None). The captured step is the model's forward over one padded
size's static buffers (local_engine.model.decode_graphs.DecodeBuffers): the buffers' token ids at their positions,
every row's logits kept, and at each layer the rows' new K/V written into the pool with `index_copy_` at the static
write slots, then attended by a StaticAttention over the static page table. It reads no value on the host and
allocates nothing whose address a replay could not reuse, so a CUDA graph can capture it.

A GraphBackend pairs that attention with how a step is captured:

- FlashInfer's decode kernel in CUDA graphs (local_engine.model.flashinfer_decode), which ModelRunner builds on CUDA
  with the flashinfer attention backend;
- `eager_graph_backend()`: the same step over the same buffers on any device, run again at every "replay" and
  attended by scaled-dot-product attention over the slots the page table names (it reads the table on the host, so
  it is never captured). The CPU tests check the graph path's bookkeeping and logits with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from local_engine.cache import KVPool
from local_engine.model.decode_graphs import DecodeBuffers, DecodeGraphs, DecodeGraphSettings, DecodeInputs, Replay

if TYPE_CHECKING:
    from local_engine.model.runner import ScheduledChunk

# attention(layer, q, k, v, scaling): q `[1, num_heads, T, head_dim]`, k, v `[1, num_kv_heads, T, head_dim]` ->
# `[1, T, num_heads, head_dim]` (the shape of FusedLlamaForward's attention argument)
Attention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
# forward(input_ids `[T]`, positions `[T]`, keep `[K]`, attention) -> logits `[K, vocab]`
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Attention], torch.Tensor]
Step = Callable[[DecodeBuffers], torch.Tensor]


class StaticAttention(Protocol):
    """Decode attention over one size's static page table."""

    def prepare(self, buffers: DecodeBuffers, inputs: dict[str, torch.Tensor]) -> None:
        """Host-side work before each replay of `buffers`' graph and before its capture; `inputs` are the step's
        padded inputs on the host (DecodeGraphs.host_inputs)."""

    def attend(self, buffers: DecodeBuffers, layer: int, queries: torch.Tensor, pool_k: torch.Tensor,
               pool_v: torch.Tensor, scaling: float) -> torch.Tensor:
        """`queries` `[S, num_heads, head_dim]` attended over the contexts `buffers`' page table names, in one pool
        layer (`pool_k`, `pool_v`: `[num_slots, num_kv_heads, head_dim]`, this step's K/V already written).
        Returns `[S, num_heads, head_dim]`."""


@dataclass(frozen=True)
class GraphBackend:
    """`attention` of the captured step; `capture(step)` gives DecodeGraphs' `capture(size, buffers) -> replay`."""

    attention: StaticAttention
    capture: Callable[[Step], Callable[[int, DecodeBuffers], Replay]]


class SdpaStaticAttention:
    """StaticAttention by gathering each row's slots and one padded scaled-dot-product attention (any device; reads
    the page table's lengths on the host, so it serves eager replays only)."""

    def prepare(self, buffers: DecodeBuffers, inputs: dict[str, torch.Tensor]) -> None:
        pass

    def attend(self, buffers: DecodeBuffers, layer: int, queries: torch.Tensor, pool_k: torch.Tensor,
               pool_v: torch.Tensor, scaling: float) -> torch.Tensor:
        indptr = buffers.kv_indptr.tolist()
        lengths = [end - start for start, end in zip(indptr[:-1], indptr[1:])]
        rows, longest = len(lengths), max(lengths)
        slots = torch.zeros(rows, longest, dtype=torch.int64, device=pool_k.device)
        for row, (start, end) in enumerate(zip(indptr[:-1], indptr[1:])):
            slots[row, : end - start] = buffers.kv_indices[start:end]
        real = torch.arange(longest, device=pool_k.device) < torch.tensor(lengths, device=pool_k.device)[:, None]
        kv_heads, head_dim = pool_k.shape[1], pool_k.shape[2]
        keys = pool_k.index_select(0, slots.view(-1)).view(rows, longest, kv_heads, head_dim).transpose(1, 2)
        values = pool_v.index_select(0, slots.view(-1)).view(rows, longest, kv_heads, head_dim).transpose(1, 2)
        attended = F.scaled_dot_product_attention(queries.unsqueeze(2).to(keys.dtype), keys, values,
                                                  attn_mask=real[:, None, None, :], scale=scaling, enable_gqa=True)
        return attended.squeeze(2)  # [S, num_heads, head_dim]


class EagerCapture:
    """A `capture` whose replay runs the step again over the same buffers; `captured` lists the sizes captured."""

    def __init__(self, step: Step) -> None:
        self.step = step
        self.captured: list[int] = []

    def __call__(self, size: int, buffers: DecodeBuffers) -> Replay:
        self.captured.append(size)
        return lambda: self.step(buffers)


def eager_graph_backend() -> GraphBackend:
    """The captured step's path on any device, without a graph: SdpaStaticAttention, EagerCapture."""
    return GraphBackend(SdpaStaticAttention(), EagerCapture)


class GraphedDecode:
    """Decode steps of one ModelRunner replayed from graphs captured per padded batch size."""

    def __init__(self, forward: Forward, pool: KVPool, settings: DecodeGraphSettings, backend: GraphBackend) -> None:
        """`forward`: the model's forward with an attention function (ModelRunner's). `settings.scratch_slot` must be
        a slot of `pool` that no sequence owns. Raises ValueError for a scratch slot outside the pool, or
        `max_batch` or `max_context` below 1."""
        if not 0 <= settings.scratch_slot < pool.num_slots:
            raise ValueError(f"scratch slot {settings.scratch_slot} is not a slot of a pool of {pool.num_slots}")
        self.pool = pool
        self._forward = forward
        self._attention = backend.attention
        self.capture = backend.capture(self._step)
        self.graphs = DecodeGraphs(settings.max_batch, settings.max_context, settings.scratch_slot,
                                   pool.k.device, self.capture, backend.attention.prepare)

    def inputs_of(self, chunks: Sequence[ScheduledChunk]) -> DecodeInputs | None:
        """The step as DecodeInputs when it replays a graph, else None (it runs eagerly): see the module's rules."""
        if any(len(chunk.token_ids) != 1 or chunk.all_logits or not chunk.needs_logits for chunk in chunks):
            return None
        if not self.graphs.fits(len(chunks), max(len(chunk.slot_table) for chunk in chunks)):
            return None
        tables = [chunk.slot_table for chunk in chunks]
        return DecodeInputs(torch.tensor([chunk.token_ids[0] for chunk in chunks], dtype=torch.int64),
                            torch.tensor([len(table) - 1 for table in tables], dtype=torch.int64), tables)

    def run(self, step: DecodeInputs) -> torch.Tensor:
        """float32 logits `[n, vocab]` of the step's rows, in their order: a copy, so the next step's replay does
        not overwrite them."""
        return self.graphs.run(step).clone()

    def _step(self, buffers: DecodeBuffers) -> torch.Tensor:
        """The captured step: float32 logits `[S, vocab]` of every row of `buffers`."""
        keep = torch.arange(buffers.size, device=buffers.input_ids.device)

        def attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float) -> torch.Tensor:
            pool_k, pool_v = self.pool.k[layer], self.pool.v[layer]
            pool_k.index_copy_(0, buffers.write_slots, k[0].transpose(0, 1).to(pool_k.dtype))
            pool_v.index_copy_(0, buffers.write_slots, v[0].transpose(0, 1).to(pool_v.dtype))
            queries = q[0].transpose(0, 1)  # [S, num_heads, head_dim]
            attended = self._attention.attend(buffers, layer, queries, pool_k, pool_v, scaling)
            return attended.to(q.dtype).unsqueeze(0)

        return self._forward(buffers.input_ids, buffers.positions, keep, attention).float()
