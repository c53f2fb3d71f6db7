"""The only module that knows transformers' internals.

Every engine step is one forward pass over one packed batch: the tokens of all scheduled sequences (one decode token
per running sequence, plus prefill chunks) side by side in an input of shape `[1, num_tokens]`, each with its own
position id. The model runs without a transformers cache object: attention is the function `paged_attention`,
registered in transformers' `AttentionInterface` and selected as the model's attention implementation, which reads
and writes K/V in the engine's KV pool through each sequence's slot table. Llama-architecture models (float32, or bfloat16 on the
CPU) run through `FusedLlamaForward` instead (fewer, larger operations per layer, on packed weights in bf16;
local_engine.model.fused_llama), which calls the same attention function. Since that name has no entry in `AttentionMaskInterface`, transformers builds no dense
mask. Each step's attention function (`paged_attention` over the step's `PagedBatch`, or the
captured step's) reaches the registered attention function as the forward keyword argument `step_attention`, which
transformers passes down to every attention call.

With `batch_invariant` (the engine's default), steps run through InvariantLlamaForward instead, where it supports
the model (local_engine.model.invariant_forward): its attention is planned per step (`step_attention`) and every
token's logits and K/V are the same bits whatever else the step holds.

Decode steps replayed from CUDA graphs (local_engine.model.graph_step): on CUDA with the flashinfer attention backend,
given `decode_graphs` settings and without `enforce_eager`, a step of single-token chunks that fits the captured sizes
replays the graph of its padded batch size (FlashInfer's decode kernel over static buffers); every other step runs
eagerly as above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from local_engine.model import cpu_kernels
from local_engine.model.attention_backends import resolve_attention_backend
from local_engine.cache import KVPool, KVPoolConfig
from local_engine.model.decode_graphs import DecodeGraphSettings
from local_engine.model.flashinfer_attention import FlashInferAttention
from local_engine.model.fused_llama import FusedLlamaForward, native_step_tokens
from local_engine.model.graph_step import Attention, GraphBackend, GraphedDecode
from local_engine.model.kernel_extension import count_torch_step
from local_engine.model.invariant_forward import InvariantLlamaForward, step_attention
from local_engine.model.paged_attention import build_paged_batch, paged_attention

ATTENTION_IMPLEMENTATION = "prefixscope_paged"


def _attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    attention: Attention | None = kwargs.get("step_attention")
    if attention is None:
        # The model called outside an engine step (a reference computation over a whole sequence): plain SDPA.
        if query.shape[2] != key.shape[2] and query.shape[2] > 1:
            raise NotImplementedError("without a paged batch only whole sequences or single tokens are supported")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return attention(module.layer_idx, query, key, value, scale), None


AttentionInterface.register(ATTENTION_IMPLEMENTATION, _attention_forward)


@dataclass(frozen=True)
class ScheduledChunk:
    """One sequence's part of a step: `token_ids` at positions `[len(slot_table) - len(token_ids), len(slot_table))`.

    `slot_table`: int64 CPU `[num_context_tokens]`, the slots of every token of the sequence up to and including
    this chunk (the chunk's own slots are where its new K/V are written). `needs_logits`: the chunk ends at the
    sequence's last known token, so the next token is sampled from its logits.
    """

    token_ids: tuple[int, ...] | list[int]
    slot_table: torch.Tensor
    needs_logits: bool
    # The logits of every token of the chunk are wanted too (a prompt's log-probabilities).
    all_logits: bool = False


@dataclass(frozen=True)
class StepLogits:
    """`logits`: float32 `[num_chunks_needing_logits, vocab]` in the order of the chunks; `chunk_logits`: for each
    chunk (by its index) that asked for `all_logits`, float32 `[len(chunk.token_ids), vocab]`."""

    logits: torch.Tensor
    chunk_logits: dict[int, torch.Tensor]


class ModelRunner:
    """Runs a causal LM over packed batches whose K/V live in a KVPool."""

    def __init__(self, model: torch.nn.Module, pool: KVPool, attention_backend: str = "auto",
                 fused: bool = True, *, decode_graphs: DecodeGraphSettings | None = None,
                 enforce_eager: bool = False, graph_backend: GraphBackend | None = None,
                 batch_invariant: bool = False, cpu_kernels_mode: str | None = None) -> None:
        """`attention_backend`: one of `local_engine.model.attention_backends.ATTENTION_BACKENDS` (raises ValueError
        when it cannot run on the pool's device). `fused`: run Llama-architecture models through FusedLlamaForward
        (the others, or with False, through transformers' forward).

        `decode_graphs`: replay decode steps from graphs captured per padded batch size (its scratch slot must be a
        pool slot no sequence owns); unless `enforce_eager`, they are used on CUDA with the flashinfer backend
        (FlashInfer's decode kernel in CUDA graphs), or on any device with `graph_backend` (how steps are captured
        and attended, e.g. `graph_step.eager_graph_backend()`). Raises ValueError for a scratch slot outside the
        pool.

        `batch_invariant`: every step runs through InvariantLlamaForward where it supports the model and pool
        (local_engine.model.invariant_forward: a token's logits and K/V do not depend on the rest of the step), with
        no decode graphs; `self.batch_invariant` says whether it does.

        `cpu_kernels_mode`: "auto" or "off" sets the process's CPU kernels switch (`cpu_kernels.set_mode`) before
        the forward is built; None leaves it."""
        self.model = model
        if cpu_kernels_mode is not None:
            cpu_kernels.set_mode(cpu_kernels_mode)
        self.invariant = (InvariantLlamaForward.of(model)
                          if batch_invariant and InvariantLlamaForward.supports(model)
                          and pool.k.device.type == "cpu" and pool.k.dtype == next(model.parameters()).dtype
                          else None)
        self._fused = FusedLlamaForward.of(model) if fused and FusedLlamaForward.supports(model) else None
        self.pool = pool
        self.native_tokens = native_step_tokens(pool.k[0])  # a step of up to this many runs on the CPU kernels
        self.device = pool.k.device
        self.attention_backend = resolve_attention_backend(attention_backend, self.device)
        config = model.config.get_text_config(decoder=True)
        self._kernel: FlashInferAttention | None = None
        if self.attention_backend == "flashinfer":
            self._kernel = FlashInferAttention(self.device, config.num_attention_heads, pool.config.num_kv_heads,
                                               pool.config.head_dim, pool.config.dtype)
            if graph_backend is None and decode_graphs is not None and not enforce_eager:
                from local_engine.model.flashinfer_decode import flashinfer_graph_backend

                graph_backend = flashinfer_graph_backend(self.device, config.num_attention_heads,
                                                         pool.config.num_kv_heads, pool.config.head_dim,
                                                         pool.config.dtype, _attention_scaling(model, pool))
        self.graphed: GraphedDecode | None = None  # None: every step runs eagerly
        if (decode_graphs is not None and graph_backend is not None and not enforce_eager
                and self.invariant is None):
            self.graphed = GraphedDecode(self._forward, pool, decode_graphs, graph_backend)
        if model.config._attn_implementation != ATTENTION_IMPLEMENTATION:
            model.set_attn_implementation(ATTENTION_IMPLEMENTATION)

    @property
    def batch_invariant(self) -> bool:
        """Whether every step runs batch-invariantly (see `__init__`)."""
        return self.invariant is not None

    @staticmethod
    def pool_config_for(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> KVPoolConfig:
        config = model.config.get_text_config(decoder=True)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return KVPoolConfig(config.num_hidden_layers, num_kv_heads, head_dim, dtype, device)

    def forward(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        """Run one step. Returns float32 logits `[num_chunks_needing_logits, vocab]`, in the order of `chunks`.

        Raises ValueError when a chunk is empty or its slot table is shorter than its tokens.
        """
        return self.run(chunks).logits

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk]) -> StepLogits:
        """`forward`, plus every token's logits for the chunks that ask for `all_logits`. A step that fits the
        captured decode graphs replays one (see the module docstring)."""
        if not chunks:
            raise ValueError("a step needs at least one chunk")
        for chunk in chunks:
            if not chunk.token_ids or len(chunk.slot_table) < len(chunk.token_ids):
                raise ValueError("each chunk needs tokens and a slot for every one of them")
        graph_step = self.graphed.inputs_of(chunks) if self.graphed is not None else None
        if graph_step is not None:
            return StepLogits(self.graphed.run(graph_step), {})
        # Decode tokens go first so the attention function can batch them.
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].token_ids) != 1)
        num_decode = sum(1 for chunk in chunks if len(chunk.token_ids) == 1)
        token_ids, positions, keep, keep_owner = [], [], [], []
        all_rows: dict[int, int] = {}  # chunk index -> its first row in `keep`
        for i in order:
            chunk = chunks[i]
            start = len(chunk.slot_table) - len(chunk.token_ids)
            token_ids.extend(chunk.token_ids)
            positions.extend(range(start, len(chunk.slot_table)))
            if chunk.all_logits:
                all_rows[i] = len(keep)
                keep.extend(range(len(token_ids) - len(chunk.token_ids), len(token_ids)))
            if chunk.needs_logits:
                if not chunk.all_logits:
                    keep.append(len(token_ids) - 1)
                keep_owner.append((i, len(keep) - 1))
        input_ids = torch.tensor(token_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        position_ids = torch.tensor(positions, dtype=torch.int64).to(self.device, non_blocking=True)
        keep_index = torch.tensor(keep, dtype=torch.int64).to(self.device, non_blocking=True)
        if self.invariant is not None:
            attention = step_attention(self.pool.k, self.pool.v, [chunks[i].slot_table for i in order],
                                       [len(chunks[i].token_ids) for i in order])
            logits = self.invariant(input_ids, position_ids, keep_index, attention)
        else:
            logits = self._paged_step(chunks, order, num_decode, input_ids, position_ids, keep_index)
        logits = logits.float()  # [len(keep), vocab], in packed order
        # Back to the callers' order.
        rank = dict(keep_owner)
        wanted = [rank[i] for i in range(len(chunks)) if i in rank]
        chunk_logits = {i: logits[first : first + len(chunks[i].token_ids)] for i, first in all_rows.items()}
        if wanted == list(range(len(keep_owner))) and len(wanted) == len(logits):
            return StepLogits(logits, chunk_logits)
        return StepLogits(logits.index_select(0, torch.tensor(wanted, dtype=torch.int64).to(logits.device)),
                          chunk_logits)

    def _paged_step(self, chunks: list[ScheduledChunk], order: list[int], num_decode: int, input_ids: torch.Tensor,
                    position_ids: torch.Tensor, keep_index: torch.Tensor) -> torch.Tensor:
        """One step through the fused or transformers forward over a PagedBatch: `chunks` packed in `order` (the
        first `num_decode` are decode rows). Returns logits `[len(keep_index), vocab]` in packed order."""
        batch = build_paged_batch(
            self.pool,
            [chunks[i].slot_table for i in order],
            [len(chunks[i].token_ids) for i in order],
            num_decode,
            kernel=self._kernel,
        )
        # Every row a decode row on the CPU kernels: the fused forward may run all its layers in one call.
        decode = (cpu_kernels.DecodeStep(batch.decode_plan, batch.write_slots, self.pool.k, self.pool.v)
                  if batch.decode_plan is not None and not batch.chunks else None)
        return self._forward(input_ids, position_ids, keep_index,
                             lambda layer, q, k, v, scale: paged_attention(batch, layer, q, k, v, scale), decode)

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor,
                 attention: Attention, decode: cpu_kernels.DecodeStep | None = None) -> torch.Tensor:
        """The model over one packed step: `input_ids`, `position_ids` int64 `[num_tokens]`, `keep` int64
        `[num_kept]`; `decode` as FusedLlamaForward takes it. Returns logits `[num_kept, vocab]` (the model's dtype,
        or float32). A step on the CPU that the CPU kernels do not compute counts as the `torch` path
        (cpu_kernels.path_counts)."""
        native = self._fused is not None and self._fused.native and input_ids.shape[0] <= self.native_tokens
        if not native and self.device.type == "cpu":
            count_torch_step()
        if self._fused is not None:
            return self._fused(input_ids, position_ids, keep, attention, decode, self.native_tokens)
        return self.model(input_ids=input_ids.unsqueeze(0), position_ids=position_ids.unsqueeze(0), use_cache=False,
                          logits_to_keep=keep, step_attention=attention).logits[0]


def _attention_scaling(model: torch.nn.Module, pool: KVPool) -> float:
    """The softmax scale of the model's attention layers (their `scaling`), else `head_dim ** -0.5`."""
    for module in model.modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, float) and hasattr(module, "layer_idx"):
            return scaling
    return pool.config.head_dim ** -0.5
