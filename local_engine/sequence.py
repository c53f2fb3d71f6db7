"""The engine's state for one request while it is admitted: working KV, generated tokens, locks, timings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from local_engine.detokenizer import IncrementalDetokenizer
from local_engine.engine_types import GenerationRequest, RequestHandle, RequestTimings
from local_engine.model_runner import WorkingKV
from local_engine.sampling import Sampler


@dataclass
class Sequence:
    request: GenerationRequest
    handle: RequestHandle
    detokenizer: IncrementalDetokenizer
    sampler: Sampler
    submitted_s: float = field(default_factory=time.perf_counter)
    working: WorkingKV | None = None
    locked_node: object = None  # the tree node this request holds a reference on
    pending_slots: object = None  # slots allocated for the prompt suffix, not yet handed to the tree
    stored_prompt_tokens: int = 0  # how much of the prompt the tree holds under `locked_node`
    matched_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    # timings, in seconds
    admitted_s: float = 0.0
    first_token_s: float = 0.0
    bookkeeping_s: float = 0.0
    prefill_s: float = 0.0
    kv_write_s: float = 0.0
    decode_s: float = 0.0

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.prompt_token_ids

    @property
    def namespace(self) -> str:
        return self.request.namespace

    @property
    def last_token(self) -> int:
        return self.generated[-1]

    def computed_token_ids(self) -> list[int]:
        """Every token whose KV sits in the working cache: the prompt and all generated tokens but the last."""
        num_generated_computed = self.working.num_tokens - len(self.prompt) if self.working else 0
        return list(self.prompt) + self.generated[:num_generated_computed]

    def timings(self) -> RequestTimings:
        return RequestTimings(
            queued_ms=(self.admitted_s - self.submitted_s) * 1000 if self.admitted_s else 0.0,
            bookkeeping_ms=self.bookkeeping_s * 1000,
            prefill_ms=self.prefill_s * 1000,
            ttft_ms=(self.first_token_s - self.submitted_s) * 1000 if self.first_token_s else 0.0,
            decode_ms=self.decode_s * 1000,
            num_decode_steps=max(0, len(self.generated) - 1),
        )
