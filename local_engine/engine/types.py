"""What goes into the engine and what comes out of it, as small named results."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from local_engine.cache import MissKind
from local_engine.cache.tiers import TierTokens
from local_engine.errors import EngineError
from local_engine.engine.sampling import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    namespace: str = ""  # the cache salt: requests in different namespaces never share cached KV
    retention: str | None = None  # `local_engine.cache.tiers.RETENTION_CLASSES`; None: the engine's `--ttl`


@dataclass(frozen=True)
class MatchReport:
    """How much of the prompt came from cache, known before the first token is computed."""

    prompt_tokens: int
    matched_tokens: int
    miss_kind: MissKind
    # `matched_tokens` split by the tier that held them (None: all on the device, as without lower tiers), and the
    # time spent loading the host and disk part back into device slots (ms).
    tier_tokens: TierTokens | None = None
    load_ms: float = 0.0
    # Tokens per cache page (matches are page-aligned); the longest prefix an earlier request in the namespace
    # computed (>= matched_tokens); for an evicted/expired miss, what was dropped (kind, tier, retention, idle_s).
    page_size: int | None = None
    seen_tokens: int | None = None
    dropped: dict | None = None

    @classmethod
    def of(cls, match: Any, prompt_tokens: int, page_size: int) -> MatchReport:
        """From a prefix cache's `MatchResult` for a prompt of `prompt_tokens` tokens."""
        return cls(prompt_tokens, match.matched_tokens, match.miss_kind, tier_tokens=match.tier_tokens,
                   load_ms=match.load_ms, page_size=page_size, seen_tokens=match.seen_tokens, dropped=match.dropped)

    @property
    def tiers(self) -> TierTokens:
        return self.tier_tokens if self.tier_tokens is not None else TierTokens(device=self.matched_tokens)

    def as_dict(self) -> dict:
        return {"matched_tokens": self.matched_tokens, "prompt_tokens": self.prompt_tokens, "miss": self.miss_kind.value}


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability and the `top` most likely tokens at its position, as (token id, logprob), most
    likely first (empty when no alternatives were asked for)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokenDelta:
    text: str
    token_ids: tuple[int, ...]
    index: int = 0  # which of the request's sequences (`n`, `best_of`) it belongs to
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id, when the request asked for logprobs


@dataclass(frozen=True)
class PromptLogprobs:
    """The prompt's log-probabilities (completions `echo` with `logprobs`), sent once before the first token.
    `entries[i]` is for prompt token i + 1 (the first token has none)."""

    token_ids: tuple[int, ...]
    entries: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class RequestTimings:
    queued_ms: float  # submit to admission
    bookkeeping_ms: float  # radix tree and slot allocator work for this request
    prefill_ms: float
    ttft_ms: float  # submit to first token
    decode_ms: float
    num_decode_steps: int


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # stop | length | cancelled
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    timings: RequestTimings
    matched_stop: str | None = None  # the stop string that ended generation (finish_reason "stop"), if one did
    index: int = 0  # which of the request's sequences ended
    cumulative_logprob: float = 0.0  # sum of the sampled tokens' raw log-probabilities (kept for `best_of`)


@dataclass
class RequestHandle:
    """The caller's side of one request: the match report, then token deltas, then one Finished (or an error)."""

    loop: asyncio.AbstractEventLoop
    num_sequences: int = 1  # the stream ends after this many Finished events (`n`, `best_of`)
    report: asyncio.Future = field(init=False)
    events: asyncio.Queue = field(init=False)
    cancelled: bool = False

    def __post_init__(self) -> None:
        self.report = self.loop.create_future()
        self.events = asyncio.Queue()

    def cancel(self) -> None:
        """Stop generating (the client went away); the engine releases the request's locks and slots."""
        self.cancelled = True

    async def stream(self):
        """Yields TokenDelta events (and a PromptLogprobs first when asked) and one Finished per sequence, the
        last one last; raises the EngineError that ended the request."""
        num_finished = 0
        while True:
            event = await self.events.get()
            if isinstance(event, EngineError):
                raise event
            yield event
            if isinstance(event, Finished):
                num_finished += 1
                if num_finished == self.num_sequences:
                    return

    # Called from the engine's worker thread.
    def _resolve_report(self, report: MatchReport) -> None:
        self.loop.call_soon_threadsafe(_set_result, self.report, report)

    def _fail(self, error: EngineError) -> None:
        self.loop.call_soon_threadsafe(_set_exception, self.report, error)
        self.loop.call_soon_threadsafe(self.events.put_nowait, error)

    def _emit(self, event: TokenDelta | PromptLogprobs | Finished) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


def _set_result(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
        future.exception()  # mark retrieved: a request may fail after its report was already consumed
