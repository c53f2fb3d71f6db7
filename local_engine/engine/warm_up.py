"""Warm-up before the engine says it is ready: every first-call cost of serving paid once, leaving no trace.

A process pays some costs the first time a path runs, not again: the grammar engine's tokenizer index (llguidance's
`LLTokenizer`, about 0.9 s of CPU for SmolLM2's 49k vocabulary), the chat template's compilation, a kernel library's
kernels built for a new matrix shape (oneDNN's bf16 GEMM, cuBLAS, FlashInfer), a decode step's CUDA graph captured
for each padded batch size, the rotary table, the thread pools and workspaces. Paid by the first request, they land
in its time to first token and in the prefill speed the engine reports (and so in the dashboard's "time saved").

`warm_up` runs each of those paths once at the sizes the engine will use, before `Engine.start`: prefill chunks of
`--max-num-batched-tokens` tokens from an empty context and a short chunk after a long context (a request whose
prefix was cached), decode steps of each batch size CUDA graphs are captured for up to `--max-num-seqs` (on a
batch-invariant runner, whose kernels build nothing per shape, one short chunk and a one-row decode step), and one draw
each of greedy, seeded top-p with log-probabilities and penalties, and a JSON grammar. It drives the model runner
and the sampling functions directly, never `Engine.step`: no request is admitted, nothing enters the prefix cache or
the tiers, no KV event is announced, and no counter, histogram or metric moves. The slots it borrows come from the
allocator and go back to it (the free list as it was, the K/V bytes zeroed), so the pool is a fresh engine's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from local_engine.engine.batch_sampling import sample_rows
from local_engine.engine.compute_threads import on_worker_threads
from local_engine.engine.sampling import SamplingParams
from local_engine.engine.structured_output import compile_json_schema
from local_engine.engine.types import GenerationRequest, RequestHandle
from local_engine.model.decode_graphs import capture_sizes
from local_engine.model.runner import ScheduledChunk
from local_engine.prompt.chat_prompt import chat_prompt_token_ids

log = logging.getLogger(__name__)

# New tokens of the short chunk after a long context: a request whose long prefix came from the cache. It stays within
# the CPU kernels' native step (fused_llama.NATIVE_STEP_TOKENS), the path such a chunk takes there.
CACHED_PREFIX_CHUNK_TOKENS = 25
DECODE_CONTEXT_TOKENS = 64  # context of each decode row (a prefix of the prefilled chunk, shared as agents share one)
# A batch-invariant runner's kernels build nothing per shape (no JIT, no graphs: local_engine.model.invariant_forward),
# so a chunk of this many tokens and a one-row decode step warm all they have (the rotary table, the thread pool, the
# weights' pages) in a fraction of a full-size prefill.
INVARIANT_CHUNK_TOKENS = 32


class WarmUpStopped(Exception):
    """`should_stop` turned true between two phases: the engine is shutting down before it was ready."""


@dataclass
class WarmUpReport:
    """What the warm-up ran: each phase's name (`prefill 512`, `decode 8 rows`, `sampling`) with its wall time in
    milliseconds, in the order run; `seconds`: the whole warm-up's wall time."""

    phases_ms: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def describe(self) -> str:
        """One line for the start-up log: the total and the slowest phases."""
        slowest = sorted(self.phases_ms.items(), key=lambda item: -item[1])[:4]
        parts = ", ".join(f"{name} {ms:.0f} ms" for name, ms in slowest)
        return f"warm-up took {self.seconds:.1f} s ({len(self.phases_ms)} phases; slowest: {parts})"


def warm_up(engine, should_stop: Callable[[], bool] = lambda: False) -> WarmUpReport:
    """Run the warm-up (see the module docstring) on a short-lived thread with the engine worker's torch thread count
    (`compute_threads.on_worker_threads`), so kernels built for that count are the ones warmed. Call it before
    `engine.start()`, with no request running. Raises WarmUpStopped when `should_stop()` turns true between phases
    (everything borrowed is given back first), and whatever a forward pass raises."""
    return on_worker_threads(lambda: _WarmUp(engine, should_stop).run())


class _WarmUp:
    def __init__(self, engine, should_stop: Callable[[], bool]) -> None:
        self.engine = engine
        self.should_stop = should_stop
        self.report = WarmUpReport()
        self.borrowed: list[torch.Tensor] = []

    def run(self) -> WarmUpReport:
        started = time.perf_counter()
        allocator = self.engine.allocator
        with self.engine.tree_lock:
            was_all_free = allocator.num_free == allocator.num_slots
        try:
            self._run_phases()
        finally:
            self._give_back(was_all_free)
        self.report.seconds = time.perf_counter() - started
        return self.report

    # ---- phases -------------------------------------------------------------------------------------------------

    def _run_phases(self) -> None:
        engine = self.engine
        config, loaded = engine.config, engine.loaded
        tokens = self._prompt_tokens()
        # Every phase must fit the pool (a test engine's may be tiny) and the model's window.
        room = min(engine.allocator.num_free, loaded.context_window_tokens - 1)
        decode_sizes = [size for size in capture_sizes(config.max_num_seqs) if size <= max(1, room // 4)]
        chunk = max(1, min(config.max_num_batched_tokens, room - CACHED_PREFIX_CHUNK_TOKENS - sum(decode_sizes)))
        if engine.runner.batch_invariant:
            decode_sizes, chunk = decode_sizes[:1], min(chunk, INVARIANT_CHUNK_TOKENS)
        context = self._borrow(chunk)
        logits = self._phase(f"prefill {chunk}", [ScheduledChunk(_tiled(tokens, chunk), context, True)])
        if room - chunk - sum(decode_sizes) >= CACHED_PREFIX_CHUNK_TOKENS:
            table = torch.cat([context, self._borrow(CACHED_PREFIX_CHUNK_TOKENS)])
            short = _tiled(tokens[::-1], CACHED_PREFIX_CHUNK_TOKENS)
            self._phase(f"prefill {CACHED_PREFIX_CHUNK_TOKENS} after {chunk} cached",
                        [ScheduledChunk(short, table, True)])
        shared = context[: min(DECODE_CONTEXT_TOKENS, chunk)]
        for size in decode_sizes:
            rows = [ScheduledChunk([tokens[row % len(tokens)]], torch.cat([shared, self._borrow(1)]), True)
                    for row in range(size)]
            self._phase(f"decode {size} rows", rows)
        self._check_stop()
        phase_started = time.perf_counter()
        self._sample(tokens, logits)
        self.report.phases_ms["sampling"] = (time.perf_counter() - phase_started) * 1000

    def _prompt_tokens(self) -> list[int]:
        """A chat prompt's token ids, rendered as a request's are (which compiles the chat template once)."""
        started = time.perf_counter()
        messages = [{"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
                    {"role": "user", "content": "Which colour is the sky on a clear day, and why?"}]
        tokens = chat_prompt_token_ids(self.engine.loaded.tokenizer, messages, None)
        self.report.phases_ms["chat template"] = (time.perf_counter() - started) * 1000
        return list(tokens)

    def _phase(self, name: str, chunks: list[ScheduledChunk]) -> torch.Tensor:
        self._check_stop()
        started = time.perf_counter()
        logits = self.engine.runner.run(chunks).logits
        self.report.phases_ms[name] = (time.perf_counter() - started) * 1000
        return logits

    def _sample(self, tokens: list[int], logits: torch.Tensor) -> None:
        """One draw on each sampling path whose first call costs: the batch argmax, a seeded top-p draw with
        log-probabilities and a penalty, and a JSON grammar's mask (which builds the grammar tokenizer). The
        sequences are built as a request's are, and detokenize what they drew."""
        grammar = compile_json_schema({"type": "object"}, strict=False, param="response_format")
        kinds = [
            SamplingParams(max_tokens=2, temperature=0.0),
            SamplingParams(max_tokens=2, temperature=0.7, top_p=0.9, seed=0, logprobs=2, presence_penalty=0.5),
            SamplingParams(max_tokens=2, temperature=0.0, grammar=grammar),
        ]

        async def build():
            loop = asyncio.get_running_loop()
            return [await self.engine.sequences.build(GenerationRequest(tuple(tokens), params, namespace="warm-up"),
                                                      RequestHandle(loop)) for params in kinds]

        sequences = asyncio.run(build())
        rows = logits[-1:].float().expand(len(sequences), -1).clone()
        drawn = sample_rows(rows, [[sequence.sampler] for sequence in sequences], self.engine.sequences.grammar_masks)
        for sequence, (token,) in zip(sequences, drawn):
            sequence.detokenizer.feed(token.token_id)

    # ---- borrowed slots -----------------------------------------------------------------------------------------

    def _borrow(self, num_tokens: int) -> torch.Tensor:
        with self.engine.tree_lock:
            slots = self.engine.allocator.alloc(num_tokens)
        if slots is None:  # sized from num_free above; only a pool in use by something else gets here
            raise RuntimeError("the warm-up found the KV pool in use")
        self.borrowed.append(slots)
        return slots

    def _give_back(self, was_all_free: bool) -> None:
        """Zero the borrowed slots' K/V and return them: to a fresh free list when every slot was free before (the
        order a fresh engine hands slots out in), else to the end of the list."""
        if not self.borrowed:
            return
        slots = torch.cat(self.borrowed)
        pool = self.engine.pool
        index = slots.to(pool.k.device)
        pool.k.index_fill_(1, index, 0)
        pool.v.index_fill_(1, index, 0)
        with self.engine.tree_lock:
            if was_all_free:
                self.engine.allocator.reset()
            else:
                self.engine.allocator.free(slots)
        self.borrowed = []

    def _check_stop(self) -> None:
        if self.should_stop():
            raise WarmUpStopped("the engine is stopping")


def _tiled(tokens: list[int], length: int) -> list[int]:
    """`tokens` repeated to `length` ids."""
    return (tokens * (length // len(tokens) + 1))[:length]
