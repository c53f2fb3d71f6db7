"""The engine's state for one request: its tokens, its slot table into the KV pool, locks and timings."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from local_engine.prompt.detokenizer import IncrementalDetokenizer
from local_engine.engine.types import GenerationRequest, RequestHandle, RequestTimings, TokenLogprob
from local_engine.engine.sampling import Sampler

_admission_order = itertools.count()


@dataclass
class Sequence:
    """Slot table layout: `slot_table[:num_slots]` are the pool slots of the first `num_slots` tokens of
    `token_ids`. The first `num_tree_slots` belong to the radix tree (held by the lock on `locked_node`); the rest
    belong to this request and are freed when it ends or is preempted. `num_computed_tokens` of them hold K/V."""

    request: GenerationRequest
    handle: RequestHandle
    detokenizer: IncrementalDetokenizer
    sampler: Sampler
    submitted_s: float = field(default_factory=time.perf_counter)
    token_ids: list[int] = field(default_factory=list)  # the prompt, then every generated token
    slot_table: torch.Tensor | None = None  # int64 CPU `[len(prompt) + max_tokens]`
    num_slots: int = 0
    num_tree_slots: int = 0
    num_computed_tokens: int = 0
    locked_node: object = None  # the tree node this request holds a reference on
    admission_id: int = -1  # larger is newer; preemption picks the newest running request
    matched_tokens: int = 0  # from the first admission: what the client is told came from cache
    num_preemptions: int = 0
    needs_store: bool = False  # admitted, and its tokens go into the tree once all are computed
    finish_reason: str | None = None
    # `n` / `best_of`: which of the request's sequences this is; the first one holds the others until its prompt is
    # computed, then forks them from its KV (`SequenceKV.fork`) so the prompt is computed once.
    index: int = 0
    forks: list[Sequence] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    # Prompt log-probabilities (completions `echo` + `logprobs`): by prompt position, until sent once.
    prompt_logprobs: dict[int, TokenLogprob] | None = None
    # timings, in seconds
    admitted_s: float = 0.0
    first_token_s: float = 0.0
    last_token_s: float = 0.0
    bookkeeping_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    def __post_init__(self) -> None:
        self.token_ids = list(self.request.prompt_token_ids)
        if self.request.sampling.prompt_logprobs is not None and self.index == 0:
            self.prompt_logprobs = {}
        capacity = len(self.token_ids) + self.request.sampling.max_tokens
        self.slot_table = torch.empty(capacity, dtype=torch.int64)

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.prompt_token_ids

    @property
    def namespace(self) -> str:
        return self.request.namespace

    @property
    def generated(self) -> list[int]:
        return self.token_ids[len(self.prompt) :]

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - len(self.prompt)

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to run through the model before the next token can be sampled (1 when decoding)."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def computes_whole_prompt(self) -> bool:
        """Its prompt's log-probabilities are still to be computed: nothing may come from cache."""
        return self.prompt_logprobs is not None

    @property
    def is_prefilling(self) -> bool:
        return self.num_uncomputed_tokens > 1

    @property
    def own_slots(self) -> torch.Tensor:
        """The slots this request holds outside the tree, int64 `[num_slots - num_tree_slots]`."""
        return self.slot_table[self.num_tree_slots : self.num_slots]

    def mark_admitted(self) -> None:
        self.admission_id = next(_admission_order)
        self.needs_store = True
        if not self.admitted_s:
            self.admitted_s = time.perf_counter()

    def reset_for_recompute(self) -> None:
        """After preemption: nothing is held; the tokens so far are computed again on re-admission."""
        self.num_slots = self.num_tree_slots = self.num_computed_tokens = 0
        self.locked_node = None
        self.num_preemptions += 1

    def timings(self) -> RequestTimings:
        return RequestTimings(
            queued_ms=(self.admitted_s - self.submitted_s) * 1000 if self.admitted_s else 0.0,
            bookkeeping_ms=self.bookkeeping_s * 1000,
            prefill_ms=self.prefill_s * 1000,
            ttft_ms=(self.first_token_s - self.submitted_s) * 1000 if self.first_token_s else 0.0,
            decode_ms=self.decode_s * 1000,
            num_decode_steps=max(0, self.num_generated - 1),
        )
