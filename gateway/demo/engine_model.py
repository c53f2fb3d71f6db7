"""A small in-process model of a paged prefix cache: what an engine of a given capacity would have matched.

The demo history sends its requests "upstream" to these instead of to a server. A prompt is rendered as the chat
template's fixed opening followed by each segment (`gateway.explain.segments`) behind a short header, and cut into
tokens of `CHARS_PER_TOKEN` characters; the cache holds pages of `PAGE_TOKENS` tokens keyed by a chained hash of the
namespace (model and salt) and every token before them, as a radix tree of pages would. What is held is the shared
prefix-cache model's answer (`db.cache_model`, the what-if simulator's too): matching walks the chain until the first
page not cached; least recently used pages are evicted past `capacity_pages`, and pages idle longer than `ttl_s`
expire. With a host tier (`host_capacity_pages`), pages evicted from the device are demoted to it instead and loaded
back when a prompt uses them again; only pages evicted from the host tier are dropped. Pages dropped either way are
remembered (a bounded ghost index), so the next miss says `evicted` or `expired` as the local engine does.
The prefix computed before (cached, or dropped and still in the ghost index) is the engine's `seen_tokens`, which
with the page size and each segment's first token lets the gateway make its token ledger.
Reports come out in the engine's own shapes (`x-prefix-cache-*` headers, `usage`, `prefix_cache.hash_chain`,
`prefix_cache.tiers` and `load_ms`) for the gateway's adapters to read.
"""

from __future__ import annotations

import hashlib
import os
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from db.cache_model import DEVICE as _DEVICE, HOST as _HOST, PrefixCacheModel
from gateway.explain.segments import MODEL, PromptSegments
from gateway.upstreams.engine_report import HEADER_PAGE_SIZE, HEADER_SEEN_TOKENS, HEADER_SEGMENTS

PAGE_TOKENS = 16
CHARS_PER_TOKEN = 4
# SmolLM2's template opening (`<|im_start|>system` and a newline): 3 tokens, the same on every request.
TEMPLATE_OPENING = "<|im_start|>"
TEMPLATE_TOKENS = len(TEMPLATE_OPENING) // CHARS_PER_TOKEN
_PAGE_CHARS = PAGE_TOKENS * CHARS_PER_TOKEN
_INT63 = (1 << 63) - 1
# Loading KV back from the host tier: about 40 KB of KV a token (SmolLM2-360M: 32 layers x 5 KV heads x 64 dims x K and
# V in fp16) copied host -> device in page-sized pieces at an effective ~8 GB/s, so 0.005 ms a token: about 1/18 of
# the 0.09 ms a token the demo's prefill costs (`gateway.demo.replay`).
HOST_LOAD_MS_PER_TOKEN = 0.005


@dataclass(frozen=True, slots=True)
class Rendered:
    """A prompt as the engine sees it: its text, where each segment's text starts in it, its chunks of a page (the
    last one may be shorter) and their chained ids; `pages` are the ids of the full pages (the hash chain)."""

    text: str
    names: tuple[str, ...]
    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    chunks: tuple[str, ...]
    ids: tuple[int, ...]

    @property
    def prompt_tokens(self) -> int:
        return len(self.text) // CHARS_PER_TOKEN

    @property
    def pages(self) -> tuple[int, ...]:
        return self.ids[: len(self.text) // _PAGE_CHARS]

    def segment_starts(self) -> tuple[tuple[str, int], ...]:
        """Each segment's first token, its header's (`(("system", 3), ("messages[1]", 40))`), as the engine's
        `x-prefix-cache-segments` header gives them."""
        return tuple((name, (start - len(f"<{name}>\n")) // CHARS_PER_TOKEN)
                     for name, start in zip(self.names, self.starts, strict=True))

    def locate(self, token: int) -> tuple[str | None, int | None]:
        """The segment and character offset in it of token `token` (None, None past the end of the prompt)."""
        position = token * CHARS_PER_TOKEN
        if position >= len(self.text) or not self.names:
            return None, None
        index = max(0, bisect_right(self.starts, position) - 1)
        if position >= self.starts[index] + self.lengths[index] and index + 1 < len(self.names):
            index += 1  # in the next segment's header: its first character
        offset = min(max(0, position - self.starts[index]), self.lengths[index])
        return self.names[index], offset


def _chunk_id(parent: int, chunk: str) -> int:
    digest = hashlib.blake2b(parent.to_bytes(8, "big") + chunk.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _INT63


def render(namespace: str, segments: PromptSegments) -> Rendered:
    """Render `segments` (the model segment names the namespace, it is not prompt text); each segment ends on a token
    boundary, as the template's special tokens make it."""
    parts = [TEMPLATE_OPENING]
    names, starts, lengths = [], [], []
    position = len(TEMPLATE_OPENING)
    for segment in segments.segments:
        if segment.kind == MODEL:
            continue
        header = f"<{segment.name}>\n"
        padding = " " * (-(len(header) + len(segment.text)) % CHARS_PER_TOKEN)
        names.append(segment.name)
        starts.append(position + len(header))
        lengths.append(len(segment.text))
        parts += (header, segment.text, padding)
        position += len(header) + len(segment.text) + len(padding)
    text = "".join(parts)
    chunks = tuple(text[start : start + _PAGE_CHARS] for start in range(0, len(text), _PAGE_CHARS))
    ids = []
    parent = _chunk_id(0, namespace)
    for chunk in chunks:
        parent = _chunk_id(parent, chunk)
        ids.append(parent)
    return Rendered(text, tuple(names), tuple(starts), tuple(lengths), chunks, tuple(ids))


@dataclass(frozen=True, slots=True)
class Match:
    """One match: tokens served from cache, the prompt's length, the engine's miss kind, where the match ended, and
    the matched tokens by the tier that held them (`device_tokens + host_tokens == matched_tokens`)."""

    matched_tokens: int
    prompt_tokens: int
    miss_kind: str
    segment: str | None
    char_offset: int | None
    hash_ids: tuple[int, ...]
    device_tokens: int
    host_tokens: int
    seen_tokens: int = 0  # the longest prefix computed before in the namespace, cached or dropped since (>= matched)
    segment_starts: tuple[tuple[str, int], ...] = ()  # each segment's first token (its header's), in prompt order

    @property
    def load_ms(self) -> float:
        """Milliseconds spent loading the host tier's part back into device pages (0 when all was on the device)."""
        return self.host_tokens * HOST_LOAD_MS_PER_TOKEN


class SimulatedEngine:
    """One engine's prefix cache: page-sized chunks (a prompt's last chunk may be shorter) held in the shared
    prefix-cache model (`db.cache_model`), matched to the token. `capacity_pages` chunks at most on the device;
    `host_capacity_pages` more in a host tier that takes the chunks the device evicts (0: no host tier, evicted chunks
    are dropped); `ttl_s` seconds of idleness (of the caller's clock) before a chunk expires, in either tier. Not
    thread-safe."""

    _MAX_SIBLINGS = 64  # children of one node compared for a partial-page match

    def __init__(self, capacity_pages: int, ttl_s: float, host_capacity_pages: int = 0) -> None:
        if capacity_pages < 1 or ttl_s <= 0 or host_capacity_pages < 0:
            raise ValueError("capacity_pages must be >= 1, ttl_s > 0 and host_capacity_pages >= 0")
        self.capacity_pages = capacity_pages
        self.host_capacity_pages = host_capacity_pages
        self.ttl_s = ttl_s
        self._children: dict[int, dict[str, int]] = {}  # parent id -> {chunk text: chunk id}
        self._cache = PrefixCacheModel(
            capacity_pages, ttl_s=ttl_s, host_capacity_blocks=host_capacity_pages,
            ghost_capacity=4 * (capacity_pages + host_capacity_pages), on_drop=self._forget_children,
        )

    def _forget_children(self, chunk_id: int) -> None:
        self._children.pop(chunk_id, None)

    def match(self, rendered: Rendered, now: float) -> Match:
        """What the cache holds of `rendered` at `now`; only chunks idle past the TTL are dropped on the way."""
        cache = self._cache
        cache.expire(now)
        tiers = cache.leading_tiers(rendered.ids)
        full = len(tiers)
        spans: list[tuple[int, str]] = [(PAGE_TOKENS, tier) for tier in tiers]  # each matched chunk, in prompt order
        matched = full * PAGE_TOKENS if full < len(rendered.ids) else rendered.prompt_tokens
        if full < len(rendered.ids):
            parent = rendered.ids[full - 1] if full else None
            chunk = rendered.chunks[full]
            best, best_tier = 0, _DEVICE
            siblings = self._children.get(parent, {}) if parent is not None else {}
            for count, (text, chunk_id) in enumerate(siblings.items()):
                if count >= self._MAX_SIBLINGS:
                    break
                if text[:1] != chunk[:1] or (tier := cache.tier_of(chunk_id)) is None:
                    continue
                common = len(os.path.commonprefix((text, chunk)))
                if common > best:
                    best, best_tier = common, tier
            matched += best // CHARS_PER_TOKEN
            spans.append((best // CHARS_PER_TOKEN, best_tier))
        prompt_tokens = rendered.prompt_tokens
        # The engine always recomputes the last prompt token (it needs its logits).
        matched = min(matched, max(0, prompt_tokens - 1))
        if full >= len(rendered.ids) or matched >= prompt_tokens - 1:
            kind = "hit"
        elif (removed := cache.removed_as(rendered.ids[full])) is not None:
            kind = removed
        elif matched > TEMPLATE_TOKENS:
            kind = "partial"
        else:
            kind = "cold"
        # The matched tokens by tier: the first `matched` tokens of the matched chunks in prompt order, so the token
        # the engine recomputes comes off the last matched chunk's tier. (Chunks are evicted one by one, least recently
        # used first, so a chunk on the device may follow one on the host; each counts where it was found.)
        counts = {_DEVICE: 0, _HOST: 0}
        left = matched
        for tokens, tier in spans:
            taken = min(tokens, left)
            counts[tier] += taken
            left -= taken
        segment, offset = rendered.locate(matched)
        seen = full
        while seen < len(rendered.ids) and (cache.tier_of(rendered.ids[seen]) is not None
                                            or cache.removed_as(rendered.ids[seen]) is not None):
            seen += 1
        seen_tokens = max(matched, min(seen * PAGE_TOKENS, prompt_tokens))
        return Match(matched, prompt_tokens, kind, segment, offset, rendered.pages, counts[_DEVICE], counts[_HOST],
                     seen_tokens, rendered.segment_starts())

    def serve(self, rendered: Rendered, now: float) -> Match:
        """Match `rendered`, then cache all its chunks on the device as the prefill does (the host tier's chunks are
        loaded back; least recently used chunks past the device's capacity are demoted to the host tier, or dropped
        without one; the host tier's least recently used chunks past its capacity are dropped)."""
        result = self.match(rendered, now)
        self._cache.admit(rendered.ids, now)
        parent = None
        for chunk, chunk_id in zip(rendered.chunks, rendered.ids, strict=True):
            if parent is not None and self._cache.tier_of(parent) is not None:
                self._children.setdefault(parent, {})[chunk] = chunk_id
            parent = chunk_id
        return result


def local_engine_response(match: Match, completion_tokens: int, ttft_ms: float, with_chain: bool) -> tuple[
    dict[str, str], dict[str, Any]
]:
    """The local engine's `x-prefix-cache-*` headers and response body fields for one match (`ttft_ms`, in
    milliseconds, should include `match.load_ms`: the engine's TTFT counts loading the host tier's part back)."""
    tiers = {"device": match.device_tokens, "host": match.host_tokens, "disk": 0}
    headers = {
        "x-prefix-cache-matched-tokens": str(match.matched_tokens),
        "x-prefix-cache-prompt-tokens": str(match.prompt_tokens),
        "x-prefix-cache-miss": match.miss_kind,
        "x-prefix-cache-tiers": f"device={match.device_tokens},host={match.host_tokens},disk=0",
        "x-prefix-cache-template-tokens": str(TEMPLATE_TOKENS),
        "x-prefix-cache-ttft-ms": f"{ttft_ms:.3f}",
        # The token ledger's inputs (`gateway.upstreams.engine_report`).
        HEADER_PAGE_SIZE: str(PAGE_TOKENS),
        HEADER_SEEN_TOKENS: str(match.seen_tokens),
    }
    if match.segment_starts:
        headers[HEADER_SEGMENTS] = ",".join(f"{name}={token}" for name, token in match.segment_starts)
    if match.segment is not None and match.char_offset is not None:
        headers["x-prefix-cache-divergence-segment"] = match.segment
        headers["x-prefix-cache-divergence-offset"] = str(match.char_offset)
    prefix_cache: dict[str, Any] = {
        "matched_tokens": match.matched_tokens,
        "tiers": tiers,
        "load_ms": round(match.load_ms, 3),
    }
    if with_chain:
        chain = {"block_size": PAGE_TOKENS, "input_length": match.prompt_tokens, "hash_ids": list(match.hash_ids)}
        prefix_cache["hash_chain"] = chain
    body = {
        "usage": _usage(match.prompt_tokens, completion_tokens, match.matched_tokens),
        "prefix_cache": prefix_cache,
    }
    return headers, body


def openai_response(match: Match, completion_tokens: int, reports_cached: bool) -> dict[str, Any]:
    """An OpenAI-shaped body's `usage` (with `prompt_tokens_details.cached_tokens` when the server reports it)."""
    return {"usage": _usage(match.prompt_tokens, completion_tokens, match.matched_tokens if reports_cached else None)}


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage
