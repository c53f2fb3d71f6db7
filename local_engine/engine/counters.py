"""Monotonic counters of what the engine has done, read by /metrics, /v1/cache and the benchmark."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from local_engine.cache import MissKind
from local_engine.engine.types import RequestTimings
from local_engine.telemetry.vllm_metrics import ServingHistograms


@dataclass
class DecodeStepPhases:
    """Where the worker's time went in decode-only steps (every running request one token, no prefill), in
    seconds summed over `steps`: choosing the batch (`schedule`: cancellations, the scheduler, admissions), the
    forward pass (`forward`: building the batch's tensors, the model, attention), drawing the tokens (`sample`), and
    handing them to their requests (`emit`: detokenizing, stop strings, the stream's queue)."""

    steps: int = 0
    schedule_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    emit_s: float = 0.0

    def add(self, schedule_s: float, forward_s: float, sample_s: float, emit_s: float) -> None:
        self.steps += 1
        self.schedule_s += schedule_s
        self.forward_s += forward_s
        self.sample_s += sample_s
        self.emit_s += emit_s

    def since(self, earlier: DecodeStepPhases) -> DecodeStepPhases:
        """The steps taken since `earlier` (a copy of these counters taken then)."""
        return DecodeStepPhases(self.steps - earlier.steps, self.schedule_s - earlier.schedule_s,
                                self.forward_s - earlier.forward_s, self.sample_s - earlier.sample_s,
                                self.emit_s - earlier.emit_s)

    def per_step_ms(self) -> dict:
        """Milliseconds per step of each phase and of the whole step, or {} before any step."""
        if not self.steps:
            return {}
        phases = {"schedule": self.schedule_s, "forward": self.forward_s, "sample": self.sample_s,
                  "emit": self.emit_s}
        per_step = {name: round(seconds * 1000 / self.steps, 3) for name, seconds in phases.items()}
        per_step["step"] = round(sum(phases.values()) * 1000 / self.steps, 3)
        return per_step


@dataclass
class EngineCounters:
    """Written by the worker thread only; readers tolerate a value that is one request stale."""

    requests_by_miss_kind: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finished_requests: int = 0
    failed_requests: int = 0
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    bookkeeping_s: float = 0.0
    decode_s: float = 0.0
    engine_busy_s: float = 0.0
    preemptions: int = 0  # running requests sent back to the queue because the pool ran dry
    decode_steps: DecodeStepPhases = field(default_factory=DecodeStepPhases)
    # Latency histograms under vLLM's names (`local_engine.telemetry.vllm_metrics`).
    serving: ServingHistograms = field(default_factory=ServingHistograms)

    def count_admission(self, miss_kind: MissKind, prompt_tokens: int, cached_tokens: int) -> None:
        self.requests_by_miss_kind[miss_kind.value] += 1
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens

    def count_prefill(self, num_tokens: int, seconds: float) -> None:
        self.prefill_tokens += num_tokens
        self.prefill_s += seconds

    def count_inter_token(self, seconds: float) -> None:
        self.serving.inter_token.observe(seconds)

    def count_finish(self, completion_tokens: int, timings: RequestTimings, finish_reason: str) -> None:
        self.serving.observe_finish(finish_reason, timings.queued_ms / 1000, timings.prefill_ms / 1000,
                                    timings.ttft_ms / 1000, timings.decode_ms / 1000, completion_tokens)
        self.finished_requests += 1
        self.completion_tokens += completion_tokens
        self.bookkeeping_s += timings.bookkeeping_ms / 1000
        self.decode_s += timings.decode_ms / 1000

    def derived(self) -> dict:
        return {
            "requests_total": sum(self.requests_by_miss_kind.values()),
            "requests_by_miss_kind": dict(self.requests_by_miss_kind),
            "prompt_tokens_total": self.prompt_tokens,
            "cached_tokens_total": self.cached_tokens,
            "completion_tokens_total": self.completion_tokens,
            "preemptions_total": self.preemptions,
            "token_hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None,
            # Measured speed of computing prompt tokens: what a cached token saves, for the dashboard.
            "prefill_tokens_per_s": self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else None,
        }
