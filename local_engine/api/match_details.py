"""The match report as the server sends it: the engine's counts, plus where the match ended in the request's own
terms, how many leading tokens are template text alone, and the request's time to first token.

- `template_tokens`: leading tokens every prompt of this shape starts with (`PromptLayout.template_tokens`). A
  match that ends within them reused nothing of the request: its miss kind is `cold`, not `partial`.
- `divergence`: the part (`tools`, `system`, `messages[i]`, `prompt`) and character offset of the first uncached
  token (`PromptLayout.locate(matched_tokens)`); absent on a hit and for prompts sent as token ids.
- `ttft_ms`: submit to first token inside the engine (queue + prefill), in milliseconds, once it is known.
- `page_size`: tokens per cache page (matches are page-aligned and never include the last prompt token).
- `seen_tokens`: the longest prefix of this prompt (tokens) that an earlier request in the namespace computed, cached
  or not (`local_engine.cache.seen_index`); at least `matched_tokens`.
- `seen_divergence`: where the first token no earlier request computed lies (`{"segment", "char_offset"}`, as
  `divergence`), when `seen_tokens` ends inside the prompt.
- `segments`: the first token of each part of the rendered prompt, `[["system", 3], ["messages[1]", 40], ...]`
  (`PromptLayout.segment_starts`); absent for prompts sent as token ids.
- `dropped`: on an `evicted` / `expired` miss, what the ghost index says was dropped right after the match:
  `{"kind", "tier" (the fastest tier holding it then), "retention" (5m, 1h, persistent, default), "idle_s" (seconds
  since a request last used it)}`.
- `tiers`: `matched_tokens` split by the tier that held their KV at admission (`{"device", "host", "disk"}`); their
  sum is `matched_tokens`, which is `usage.prompt_tokens_details.cached_tokens`. `load_ms`: time spent loading the
  host and disk part back into device slots (0 when everything was on the device).

Headers (sent on every response, before the first byte): `x-prefix-cache-matched-tokens`,
`x-prefix-cache-prompt-tokens`, `x-prefix-cache-miss`, `x-prefix-cache-tiers` (`device=N,host=N,disk=N`),
`x-prefix-cache-template-tokens`, `x-prefix-cache-page-size`, `x-prefix-cache-seen-tokens`,
`x-prefix-cache-seen-segment` / `x-prefix-cache-seen-offset`, `x-prefix-cache-segments` (`system=3,messages[1]=40`), `x-prefix-cache-dropped`
(`kind=expired,tier=host,retention=5m,idle_s=301.2`, on an evicted/expired miss), and, on a miss,
`x-prefix-cache-divergence-segment` / `x-prefix-cache-divergence-offset`; `x-prefix-cache-ttft-ms` on non-streamed
responses (a stream's headers leave before its first token; its closing usage chunk carries `prefix_cache.ttft_ms`).
"""

from __future__ import annotations

from dataclasses import dataclass

from local_engine.cache import MissKind
from local_engine.cache.tiers import HEADER_TIERS, TierTokens
from local_engine.engine.types import MatchReport
from local_engine.prompt.layout import Location, PromptLayout

HEADER_TEMPLATE_TOKENS = "x-prefix-cache-template-tokens"
HEADER_DIVERGENCE_SEGMENT = "x-prefix-cache-divergence-segment"
HEADER_DIVERGENCE_OFFSET = "x-prefix-cache-divergence-offset"
HEADER_TTFT_MS = "x-prefix-cache-ttft-ms"
HEADER_PAGE_SIZE = "x-prefix-cache-page-size"
HEADER_SEEN_TOKENS = "x-prefix-cache-seen-tokens"
HEADER_SEGMENTS = "x-prefix-cache-segments"
HEADER_DROPPED = "x-prefix-cache-dropped"
HEADER_SEEN_SEGMENT = "x-prefix-cache-seen-segment"
HEADER_SEEN_OFFSET = "x-prefix-cache-seen-offset"


@dataclass(frozen=True, slots=True)
class MatchDetails:
    """A `MatchReport` read against the request's layout."""

    prompt_tokens: int
    matched_tokens: int
    miss_kind: MissKind
    template_tokens: int | None = None
    divergence: Location | None = None
    tier_tokens: TierTokens | None = None  # None: everything matched was on the device (as in `MatchReport`)
    load_ms: float = 0.0  # loading host/disk KV back into device slots
    page_size: int | None = None
    seen_tokens: int | None = None
    segments: tuple[tuple[str, int], ...] | None = None
    dropped: dict | None = None
    seen_divergence: Location | None = None

    @property
    def tiers(self) -> TierTokens:
        return self.tier_tokens if self.tier_tokens is not None else TierTokens(device=self.matched_tokens)

    def as_dict(self, ttft_ms: float | None = None) -> dict:
        body: dict = {"matched_tokens": self.matched_tokens, "prompt_tokens": self.prompt_tokens,
                      "miss": self.miss_kind.value, "tiers": self.tiers.as_dict(),
                      "load_ms": round(self.load_ms, 3)}
        if self.template_tokens is not None:
            body["template_tokens"] = self.template_tokens
        if self.divergence is not None:
            body["divergence"] = {"segment": self.divergence.segment, "char_offset": self.divergence.char_offset}
        if ttft_ms is not None:
            body["ttft_ms"] = round(ttft_ms, 3)
        for name, value in (("page_size", self.page_size), ("seen_tokens", self.seen_tokens),
                            ("dropped", self.dropped)):
            if value is not None:
                body[name] = value
        if self.segments is not None:
            body["segments"] = [list(start) for start in self.segments]
        if self.seen_divergence is not None:
            seen = self.seen_divergence
            body["seen_divergence"] = {"segment": seen.segment, "char_offset": seen.char_offset}
        return body

    def headers(self) -> dict[str, str]:
        headers = {
            "x-prefix-cache-matched-tokens": str(self.matched_tokens),
            "x-prefix-cache-prompt-tokens": str(self.prompt_tokens),
            "x-prefix-cache-miss": self.miss_kind.value,
            HEADER_TIERS: self.tiers.header_value(),
        }
        if self.template_tokens is not None:
            headers[HEADER_TEMPLATE_TOKENS] = str(self.template_tokens)
        if self.divergence is not None:
            headers[HEADER_DIVERGENCE_SEGMENT] = self.divergence.segment
            headers[HEADER_DIVERGENCE_OFFSET] = str(self.divergence.char_offset)
        if self.page_size is not None:
            headers[HEADER_PAGE_SIZE] = str(self.page_size)
        if self.seen_tokens is not None:
            headers[HEADER_SEEN_TOKENS] = str(self.seen_tokens)
        if self.segments:
            headers[HEADER_SEGMENTS] = ",".join(f"{segment}={start}" for segment, start in self.segments)
        if self.seen_divergence is not None:
            headers[HEADER_SEEN_SEGMENT] = self.seen_divergence.segment
            headers[HEADER_SEEN_OFFSET] = str(self.seen_divergence.char_offset)
        if self.dropped is not None:
            headers[HEADER_DROPPED] = ",".join(f"{name}={value}" for name, value in self.dropped.items())
        return headers


def describe_match(report: MatchReport, layout: PromptLayout | None) -> MatchDetails:
    """`report` with the template opening counted and the first uncached token located in the request."""
    tiers, load_ms = report.tier_tokens, report.load_ms
    extra = {"page_size": report.page_size, "seen_tokens": report.seen_tokens, "dropped": report.dropped}
    if layout is None:
        return MatchDetails(report.prompt_tokens, report.matched_tokens, report.miss_kind, tier_tokens=tiers,
                            load_ms=load_ms, **extra)
    template_tokens = layout.template_tokens
    miss_kind = report.miss_kind
    if miss_kind == MissKind.PARTIAL and report.matched_tokens <= template_tokens:
        miss_kind = MissKind.COLD  # only the template's fixed opening matched: nothing of this request was reused
    divergence = None if miss_kind == MissKind.HIT else layout.locate(report.matched_tokens)
    seen = report.seen_tokens
    seen_at = layout.locate(seen) if seen is not None and seen < report.prompt_tokens else None
    return MatchDetails(report.prompt_tokens, report.matched_tokens, miss_kind, template_tokens, divergence, tiers,
                        load_ms, segments=layout.segment_starts() or None, seen_divergence=seen_at, **extra)
