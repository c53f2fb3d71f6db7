"""One sampled request's counterfactuals: the tokens it would have been served from cache under each candidate.

For a candidate, the request (as the client sent it) is rewritten with the candidate's rules, and so is every
remembered earlier request of the tenant; the earlier one sharing the most leading segments with it is the prefix a
cache holding the rewritten traffic would have matched longest. How many tokens the two share comes from the
upstream itself: the engine's dry-run match (`POST /v1/cache/match`, nothing locked or changed) returns each
prompt's token hash chain (block size 1), and the shared leading hashes are the shared tokens. For upstreams without
a dry run, approximate chains over the prompts' canonical text (`gateway.explain.chains`) stand in, converted to
tokens at the request's own tokens per character.

The same is done for the request as it was actually sent, and the estimate is the actual cached tokens plus the
difference (`actual + shared_with_candidate - shared_as_sent`, clamped to [0, prompt - 1]). What the shared-prefix
model leaves out (answer tokens the engine also caches, evictions, page alignment) then cancels out instead of
biasing the estimate. A candidate that changes neither the request nor its best earlier match costs no dry run: its
estimate is the actual figure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from db.advice import AdviceOutcome
from gateway.advisor.candidates import Candidate
from gateway.advisor.history import CURRENT, Entry, Rendering, segment_keys, shared_segments
from gateway.explain.chains import CHARS_PER_TOKEN, approximate_chain, canonical_prompt_text
from gateway.explain.uplift import UpliftJob, dry_run_payload
from gateway.normalize.pipeline import Pipeline
from gateway.routing import Route

log = logging.getLogger(__name__)

_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()
Rewrite = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class AdviceJob:
    """Everything one sampled request's estimate needs, captured when the request finished."""

    endpoint: str
    raw_body: dict[str, Any]
    body: dict[str, Any]
    salt: str
    route: Route
    hash_block_size: int
    prompt_tokens: int
    cached_tokens: int
    earlier: tuple[Entry, ...]
    candidates: tuple[tuple[Candidate, Pipeline], ...]


@dataclass(frozen=True, slots=True)
class _Best:
    entry: Entry
    rendering: Rendering
    shared: int


class DryRunFailed(Exception):
    """The upstream did not answer a dry-run match usefully."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common leading run of two hash chains."""
    count = 0
    for left, right in zip(a, b, strict=False):
        if left != right:
            break
        count += 1
    return count


def best_match(
    earlier: Sequence[Entry], endpoint: str, key: str, rewrite: Rewrite | None, keys: tuple[int, ...]
) -> _Best | None:
    """The earlier request whose rendering under `key` shares the most leading segments with `keys` (the latest on a
    tie), or None when none shares even the model."""
    best: _Best | None = None
    for entry in earlier:
        if entry.endpoint != endpoint:
            continue
        rendering = entry.rendering(key, rewrite)
        shared = shared_segments(rendering.keys, keys)
        if shared and (best is None or shared >= best.shared):
            best = _Best(entry, rendering, shared)
    return best


class Estimator:
    """Estimates for one sampled request; dry runs are memoized per prompt within the request."""

    def __init__(self, job: AdviceJob, client: httpx.AsyncClient, timeout: httpx.Timeout) -> None:
        self._job = job
        self._client = client
        self._timeout = timeout
        self._chains: dict[bytes, list[int]] = {}
        self._current: tuple[int, int] | None = None
        self._chars = len(canonical_prompt_text(job.endpoint, job.body)) or 1

    async def outcomes(self) -> tuple[AdviceOutcome, ...]:
        job = self._job
        actual = Rendering(job.body, segment_keys(job.endpoint, job.body))
        best_actual = best_match(job.earlier, job.endpoint, CURRENT, None, actual.keys)
        found = []
        for candidate, pipeline in job.candidates:
            await asyncio.sleep(0)  # rewriting the history is CPU work: let the event loop serve requests between
            rewrite = _rewriter(pipeline)
            rewritten = rewrite(job.raw_body)
            target = Rendering(rewritten, segment_keys(job.endpoint, rewritten))
            best = best_match(job.earlier, job.endpoint, candidate.key, rewrite, target.keys)
            changed = target.keys != actual.keys
            if not changed and _same(best, best_actual):
                found.append(AdviceOutcome(candidate.key, job.prompt_tokens, job.cached_tokens, False))
                continue
            try:
                prompt_tokens, shared = await self._shared_tokens(target, best)
                if self._current is None:
                    self._current = await self._shared_tokens(actual, best_actual)
            except DryRunFailed as exc:
                log.debug("advice for %s skipped: %s", candidate.key, exc)
                continue
            estimate = job.cached_tokens + shared - self._current[1]
            estimate = min(max(0, estimate), max(0, prompt_tokens - 1))
            found.append(AdviceOutcome(candidate.key, prompt_tokens, estimate, changed))
        return tuple(found)

    async def _shared_tokens(self, target: Rendering, best: _Best | None) -> tuple[int, int]:
        """(prompt tokens of `target`, tokens it shares with `best`'s rendering), capped at prompt - 1."""
        if self._job.route.adapter.supports_dry_run_match:
            chain = await self._chain(target.request)
            shared = 0 if best is None else common_prefix(chain, await self._chain(best.rendering.request))
            return len(chain), min(shared, max(0, len(chain) - 1))
        return self._approximate(target, best)

    def _approximate(self, target: Rendering, best: _Best | None) -> tuple[int, int]:
        job = self._job
        tokens_per_char = job.prompt_tokens / self._chars
        text = canonical_prompt_text(job.endpoint, target.request)
        prompt_tokens = round(len(text) * tokens_per_char)
        if best is None:
            return prompt_tokens, 0
        other = canonical_prompt_text(job.endpoint, best.rendering.request)
        block = job.hash_block_size
        mine = approximate_chain(text, job.salt, block, None).hash_ids
        theirs = approximate_chain(other, job.salt, block, None).hash_ids
        shared_chars = common_prefix(mine, theirs) * block * CHARS_PER_TOKEN
        return prompt_tokens, min(round(shared_chars * tokens_per_char), max(0, prompt_tokens - 1))

    async def _chain(self, request: dict[str, Any]) -> list[int]:
        """The prompt's token hash chain (block size 1) from the engine's dry-run match."""
        job = self._job
        route = job.route
        payload = dry_run_payload(UpliftJob(job.endpoint, request, job.salt, str(route.match_url), route.headers, 0))
        memo = self._chains.get(payload)
        if memo is not None:
            return memo
        body = _DECODER.decode(payload)
        body["return_hash_chain"] = True
        body["hash_block_size"] = 1
        try:
            response = await self._client.post(
                route.match_url, content=_ENCODER.encode(body), headers=route.headers, timeout=self._timeout
            )
        except httpx.HTTPError as exc:
            raise DryRunFailed(str(exc)) from exc
        if response.status_code != 200:
            raise DryRunFailed(f"status {response.status_code}")
        try:
            answer = _DECODER.decode(response.content)
        except msgspec.DecodeError as exc:
            raise DryRunFailed("not JSON") from exc
        chain = answer.get("hash_chain") if isinstance(answer, dict) else None
        hash_ids = chain.get("hash_ids") if isinstance(chain, dict) else None
        if not isinstance(hash_ids, list):
            raise DryRunFailed("no hash chain in the answer")
        self._chains[payload] = hash_ids
        return hash_ids


def _same(best: _Best | None, best_actual: _Best | None) -> bool:
    """Whether a candidate's best earlier match is the actual one, unchanged (so it shares the same tokens)."""
    if best is None or best_actual is None:
        return best is None and best_actual is None
    return best.shared == best_actual.shared and best.rendering.keys == best_actual.rendering.keys


def _rewriter(pipeline: Pipeline) -> Rewrite:
    def rewrite(request: dict[str, Any]) -> dict[str, Any]:
        return pipeline.apply(request).request

    return rewrite
