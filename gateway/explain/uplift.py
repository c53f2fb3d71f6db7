"""Normalization uplift: how many more prompt tokens matched because the gateway normalized the request.

For a sample of answered requests that normalization changed, a background task asks the engine's dry-run match
(`POST /v1/cache/match`, nothing is locked or changed) how much of the request as the client sent it would have
matched, under the tenant's salt. The gain is the normalized request's matched tokens minus that, never below 0,
both counted beyond the template's fixed opening that the engine reports with its match (the same report the miss
explanation reads).

The dry run comes after the request, when the cache also holds the normalized prompt itself. That can only make the
un-normalized prompt match more, and only up to where the two versions part; so when normalization did not help (the
normalized match ended before they part) the difference is at most 0, and when it did, the difference is exact.
Hence the clamp at 0: a negative difference never means that normalization cost tokens.

The request's record waits for the answer (it is submitted by the task, with or without a gain), so the client never
does; meanwhile the record writer holds it (journaled, see `db.held_record`), so a crash loses nothing. Concurrency is
bounded; past `max_pending` waiting checks a request is not measured. `stop` waits for the checks in flight (bounded)
and submits the records of any it has to cancel.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx
import msgspec

from db.records import RequestRecord
from gateway.parsing import CHAT

log = logging.getLogger(__name__)

_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()
_PROMPT_FIELDS = {CHAT: ("model", "messages", "tools"), "completions": ("model", "prompt")}


@dataclass(frozen=True, slots=True)
class UpliftJob:
    """One check: the raw (un-normalized) request, where to send the dry run, and the normalized match."""

    endpoint: str
    raw_body: dict[str, Any]
    salt: str
    match_url: str
    headers: httpx.Headers
    normalized_matched_tokens: int
    # The template's fixed opening, from the same engine report: matching within it gains nothing.
    template_tokens: int = 0


def dry_run_payload(job: UpliftJob) -> bytes:
    """The dry-run body: the client's own prompt fields and the tenant's salt (client salts are never used)."""
    body = {name: job.raw_body[name] for name in _PROMPT_FIELDS[job.endpoint] if name in job.raw_body}
    body["cache_salt"] = job.salt
    return _ENCODER.encode(body)


def uplift_gain(job: UpliftJob, unnormalized_matched_tokens: int) -> int:
    """Tokens matched beyond the template's opening by the normalized request and not by the raw one (never < 0)."""
    floor = job.template_tokens
    return max(0, max(job.normalized_matched_tokens, floor) - max(unnormalized_matched_tokens, floor))


class UpliftChecker:
    """Runs dry-run matches in the background and submits each record once its check is done."""

    def __init__(
        self,
        client: Callable[[], httpx.AsyncClient],
        submit: Callable[[RequestRecord], None],
        *,
        concurrency: int = 4,
        max_pending: int = 256,
        timeout_s: float = 10.0,
    ) -> None:
        self._client = client
        self._submit = submit
        self._semaphore = asyncio.Semaphore(concurrency)
        self._max_pending = max_pending
        self._timeout = httpx.Timeout(timeout_s)
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.checked = 0
        self.failed = 0
        self.skipped = 0

    @property
    def pending(self) -> int:
        return len(self._tasks)

    def defer(
        self, record: RequestRecord, job: UpliftJob, submit: Callable[[RequestRecord], None] | None = None
    ) -> bool:
        """Start a check that submits `record` (with its gain) when done, through `submit` (default: the checker's);
        False when too many are waiting (the caller then submits the record itself, as it does once the checker is
        stopping)."""
        if self._stopping or len(self._tasks) >= self._max_pending:
            self.skipped += 1
            return False
        task = asyncio.get_running_loop().create_task(self._check(record, job, submit or self._submit))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _check(self, record: RequestRecord, job: UpliftJob, submit: Callable[[RequestRecord], None]) -> None:
        gain = None
        try:
            async with self._semaphore:
                unnormalized = await self._dry_run(job)
            if unnormalized is None:
                self.failed += 1
            else:
                self.checked += 1
                gain = uplift_gain(job, unnormalized)
        except Exception:  # a failed check must never lose the record
            self.failed += 1
            log.debug("normalization uplift check failed", exc_info=True)
        finally:
            submit(record if gain is None else replace(record, normalization_gain_tokens=gain))

    async def _dry_run(self, job: UpliftJob) -> int | None:
        """The matched tokens of the un-normalized request, or None when the engine did not say."""
        try:
            response = await self._client().post(
                job.match_url, content=dry_run_payload(job), headers=job.headers, timeout=self._timeout
            )
        except httpx.HTTPError as exc:
            log.debug("dry-run match failed: %s", exc)
            return None
        if response.status_code != 200:
            return None
        try:
            body = _DECODER.decode(response.content)
        except msgspec.DecodeError:
            return None
        matched = body.get("matched_tokens") if isinstance(body, dict) else None
        if isinstance(matched, bool) or not isinstance(matched, int):
            return None
        return matched

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for the checks in flight; cancel the rest (their records are still submitted). No new check
        starts afterwards."""
        self._stopping = True
        if not self._tasks:
            return
        _, still_running = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in still_running:
            task.cancel()
        if still_running:
            await asyncio.gather(*still_running, return_exceptions=True)
