"""One sampled request's counterfactuals: the tokens it would have been served from cache under each candidate.

For a candidate, the request (as the client sent it) is rewritten with the candidate's rules, and so are the tenant's
most recent earlier requests (at most `scan_limit` of them, each rewritten once per candidate and kept); the one sharing
the most leading segments with it is the prefix a cache holding the rewritten traffic would have matched longest. So one
sample costs at most `(scan_limit + 1) x candidates` rewrites, whatever the history holds, and the rewriting runs in a
worker thread (`asyncio.to_thread`), never on the event loop; given a `rest_after` (the advisor's pace), that thread
sleeps after each rewrite in proportion to its CPU time, so it never keeps the interpreter from the event loop for
more than one rewrite at a time. How many tokens the two share comes from the upstream
itself: the engine's dry-run match (`POST /v1/cache/match`, nothing locked or changed) returns each prompt's token hash
chain (block size 1), and the shared leading hashes are the shared tokens. For upstreams without a dry run, approximate
chains over the prompts' canonical text (`gateway.explain.chains`) stand in, converted to tokens at the request's own
tokens per character.

The same is done for the request as it was actually sent, and the estimate is the actual cached tokens plus the
difference (`actual + shared_with_candidate - shared_as_sent`, clamped to [0, prompt - 1]). What the shared-prefix model
leaves out (answer tokens the engine also caches, evictions, page alignment) then cancels out instead of biasing the
estimate. A candidate that changes neither the request nor its best earlier match costs no dry run: its estimate is the
actual figure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from db.advice import AdviceOutcome
from db.cache_model import shared_leading_blocks
from gateway.advisor.candidates import Candidate
from gateway.advisor.history import CURRENT, Entry, Rendering, segment_keys, shared_segments
from gateway.explain.chains import CHARS_PER_TOKEN, approximate_chain, canonical_prompt_text
from gateway.explain.uplift import UpliftJob, dry_run_payload
from gateway.normalize.pipeline import Pipeline
from gateway.upstreams.route import Route

log = logging.getLogger(__name__)

_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()
Rewrite = Callable[[dict[str, Any]], dict[str, Any]]
# How many of the latest earlier requests a sample compares against (each rewritten once per candidate).
DEFAULT_SCAN_LIMIT = 32


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
    settings: str = ""  # the fingerprint of the settings the request was served under
    scan_limit: int = DEFAULT_SCAN_LIMIT


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


@dataclass(frozen=True, slots=True)
class _Plan:
    """One candidate's rewritten request, its best earlier match and whether it changed the request."""

    candidate: Candidate
    target: Rendering
    best: _Best | None
    changed: bool


def scan_set(earlier: Sequence[Entry], endpoint: str, limit: int) -> tuple[Entry, ...]:
    """The latest `limit` earlier requests to the same endpoint, oldest first."""
    found: list[Entry] = []
    for entry in reversed(earlier):
        if len(found) >= limit:
            break
        if entry.endpoint == endpoint:
            found.append(entry)
    return tuple(reversed(found))


class Estimator:
    """Estimates for one sampled request; dry runs are memoized per prompt within the request."""

    def __init__(
        self,
        job: AdviceJob,
        client: httpx.AsyncClient,
        timeout: httpx.Timeout,
        rest_after: Callable[[float], float] | None = None,
    ) -> None:
        self._job = job
        self._rest_after = rest_after  # seconds a worker thread rests after a rewrite of that many CPU seconds
        self._client = client
        self._timeout = timeout
        self._chains: dict[bytes, list[int]] = {}
        self._current: tuple[int, int] | None = None
        self._chars = len(canonical_prompt_text(job.endpoint, job.body)) or 1
        self.cpu_s = 0.0  # CPU seconds of the worker-thread parts, for the advisor's budget

    def plan(self) -> tuple[Rendering, _Best | None, list[_Plan]]:
        """The CPU part (rewriting and segment matching), run in a worker thread: the request as sent with its best
        earlier match, and each candidate's plan."""
        started = time.thread_time()
        try:
            return self._plan()
        finally:
            self.cpu_s += time.thread_time() - started

    def _plan(self) -> tuple[Rendering, _Best | None, list[_Plan]]:
        job = self._job
        earlier = scan_set(job.earlier, job.endpoint, job.scan_limit)
        actual = Rendering(job.body, segment_keys(job.endpoint, job.body))
        best_actual = best_match(earlier, job.endpoint, CURRENT, None, actual.keys)
        plans = []
        for candidate, pipeline in job.candidates:
            rewrite = _rewriter(pipeline, self._rest_after)
            rewritten = rewrite(job.raw_body)
            target = Rendering(rewritten, segment_keys(job.endpoint, rewritten))
            best = best_match(earlier, job.endpoint, candidate.key, rewrite, target.keys)
            plans.append(_Plan(candidate, target, best, target.keys != actual.keys))
        return actual, best_actual, plans

    async def outcomes(self) -> tuple[AdviceOutcome, ...]:
        job = self._job
        actual, best_actual, plans = await asyncio.to_thread(self.plan)
        found = []
        for plan in plans:
            key = plan.candidate.key
            if not plan.changed and _same(plan.best, best_actual):
                found.append(AdviceOutcome(key, job.prompt_tokens, job.cached_tokens, False, job.settings))
                continue
            try:
                prompt_tokens, shared = await self._shared_tokens(plan.target, plan.best)
                if self._current is None:
                    self._current = await self._shared_tokens(actual, best_actual)
            except DryRunFailed as exc:
                log.debug("advice for %s skipped: %s", key, exc)
                continue
            estimate = job.cached_tokens + shared - self._current[1]
            estimate = min(max(0, estimate), max(0, prompt_tokens - 1))
            found.append(AdviceOutcome(key, prompt_tokens, estimate, plan.changed, job.settings))
        return tuple(found)

    async def _shared_tokens(self, target: Rendering, best: _Best | None) -> tuple[int, int]:
        """(prompt tokens of `target`, tokens it shares with `best`'s rendering), capped at prompt - 1."""
        if self._job.route.adapter.supports_dry_run_match:
            chain = await self._chain(target.request)
            shared = 0 if best is None else common_prefix(chain, await self._chain(best.rendering.request))
            return len(chain), min(shared, max(0, len(chain) - 1))
        return await asyncio.to_thread(self._approximate, target, best)

    def _approximate(self, target: Rendering, best: _Best | None) -> tuple[int, int]:
        started = time.thread_time()
        try:
            return self._approximate_in_thread(target, best)
        finally:
            self.cpu_s += time.thread_time() - started

    def _approximate_in_thread(self, target: Rendering, best: _Best | None) -> tuple[int, int]:
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
        # What a cache holding the best earlier request would serve of this one: the shared prefix-cache model.
        shared_chars = shared_leading_blocks(mine, theirs) * block * CHARS_PER_TOKEN
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


def _rewriter(pipeline: Pipeline, rest_after: Callable[[float], float] | None) -> Rewrite:
    if rest_after is None:

        def rewrite(request: dict[str, Any]) -> dict[str, Any]:
            return pipeline.apply(request).request

        return rewrite

    def paced(request: dict[str, Any]) -> dict[str, Any]:
        started = time.thread_time()
        rewritten = pipeline.apply(request).request
        rest = rest_after(time.thread_time() - started)
        if rest > 0:
            time.sleep(rest)  # hands the interpreter to the event loop between rewrites
        return rewritten

    return paced
