"""The advisor's background sampler: every request while the advisor has capacity, none past it.

Every answered request of a tenant whose `advice_sample_rate` is above 0 (0 turns advice off) joins its tenant's
history (a reference, nothing copied; a tenant with advice off keeps none). It is sampled whenever the advisor has
capacity (`gateway.advisor.capacity`: under its CPU budget, a share of one core over a sliding window, and fewer than
`max_pending` estimates in flight), not by a fixed fraction, so a quiet tenant is advised after its first handful of
requests and a busy gateway stays bounded. A sampled request's record is held while a background task estimates every
candidate (`gateway.advisor.estimate`) and then submitted with the estimates attached, so the client never waits. At
most `concurrency` estimates run at once; a request that finds no room is not sampled (counted in `skipped`). Each
estimate compares against at most `scan_limit` earlier requests and does its rewriting in a worker thread, so neither
the history size nor the rules slow the event loop. With a fleet key, a sampled record also carries its prompt's keyed
signature (`gateway.advisor.signature`) for the fleet patterns. `stop` waits (bounded) for the estimates in flight and
submits the records of any it has to cancel, without advice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace

import httpx

from db.advice import AdviceOutcome
from db.signatures import PromptSignature
from db.records import RequestRecord
from gateway.advisor.capacity import DEFAULT_CPU_BUDGET, DEFAULT_WINDOW_S, AdvisorCapacity
from gateway.advisor.candidates import candidates_for, settings_fingerprint
from gateway.advisor.estimate import DEFAULT_SCAN_LIMIT, AdviceJob, Estimator
from gateway.advisor.history import DEFAULT_HISTORY_SIZE, AdviceHistories, Entry
from gateway.advisor.signature import prompt_signature
from gateway.config.tenant import TenantSettings
from gateway.explain.explainer import ExplainContext
from gateway.normalize.pipeline import Pipeline, build_pipeline

log = logging.getLogger(__name__)

Submit = Callable[[RequestRecord], None]


class AdviceSampler:
    """Samples answered requests and estimates, off the request path, what each candidate rule would gain."""

    def __init__(
        self,
        client: Callable[[], httpx.AsyncClient],
        *,
        concurrency: int = 2,
        max_pending: int = 64,
        history_size: int = DEFAULT_HISTORY_SIZE,
        scan_limit: int = DEFAULT_SCAN_LIMIT,
        timeout_s: float = 10.0,
        cpu_budget: float = DEFAULT_CPU_BUDGET,
        window_s: float = DEFAULT_WINDOW_S,
        fleet_key: bytes = b"",
    ) -> None:
        self._client = client
        self._fleet_key = fleet_key  # keys the prompt signatures of the fleet patterns (empty: none are taken)
        self._semaphore = asyncio.Semaphore(concurrency)
        self.capacity = AdvisorCapacity(cpu_budget, window_s, max_pending)
        self._timeout = httpx.Timeout(timeout_s)
        self.histories = AdviceHistories(history_size)
        self._scan_limit = scan_limit
        self._pipelines: dict[TenantSettings, Pipeline] = {}
        self._fingerprints: dict[TenantSettings, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.sampled = 0
        self.failed = 0
        self.skipped = 0

    @property
    def pending(self) -> int:
        return len(self._tasks)

    def observe(self, context: ExplainContext | None, record: RequestRecord, submit: Submit) -> bool:
        """Remember an answered request; when it is sampled, start its estimate and return True (the task then
        submits the record through `submit`). False: the caller submits the record itself. Never raises."""
        try:
            return self._observe(context, record, submit)
        except Exception:  # advice is an extra: it must never cost a record
            log.exception("the rule advisor could not take a request")
            return False

    def _observe(self, context: ExplainContext | None, record: RequestRecord, submit: Submit) -> bool:
        if context is None or context.upstream_status is None or context.upstream_status >= 400:
            return False
        if record.status_code >= 400:
            return False
        settings = context.settings
        rate = settings.advice_sample_rate
        if rate <= 0:
            return False  # advice is off for this tenant: keep none of its requests in memory
        history = self.histories.for_tenant(context.tenant)
        earlier = history.snapshot()  # the requests before this one (a tuple of references)
        history.add(Entry(context.endpoint, context.raw_body, context.body))
        if record.prompt_tokens is None or record.cached_tokens is None:
            return False
        candidates = candidates_for(settings)
        if not candidates:
            return False
        if self._stopping or not self.capacity.has_room(len(self._tasks)):
            self.skipped += 1
            return False
        job = AdviceJob(
            endpoint=context.endpoint,
            raw_body=context.raw_body,
            body=context.body,
            salt=context.salt,
            route=context.route,
            hash_block_size=settings.hash_block_size,
            prompt_tokens=record.prompt_tokens,
            cached_tokens=record.cached_tokens,
            earlier=earlier,
            candidates=tuple((candidate, self._pipeline(candidate.settings)) for candidate in candidates),
            settings=self._fingerprint(settings),
            scan_limit=self._scan_limit,
        )
        task = asyncio.get_running_loop().create_task(self._run(job, record, submit))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def _pipeline(self, settings: TenantSettings) -> Pipeline:
        pipeline = self._pipelines.get(settings)
        if pipeline is None:
            pipeline = self._pipelines[settings] = build_pipeline(settings)
        return pipeline

    def _fingerprint(self, settings: TenantSettings) -> str:
        found = self._fingerprints.get(settings)
        if found is None:
            found = self._fingerprints[settings] = settings_fingerprint(settings)
        return found

    async def _run(self, job: AdviceJob, record: RequestRecord, submit: Submit) -> None:
        outcomes: tuple[AdviceOutcome, ...] = ()
        signature = None
        try:
            async with self._semaphore:
                estimator = Estimator(job, self._client(), self._timeout)
                outcomes = await estimator.outcomes()
                self.capacity.charge(estimator.cpu_s)
                if self._fleet_key:
                    signature, cpu_s = await asyncio.to_thread(_signed, job, self._fleet_key, record.prompt_tokens)
                    self.capacity.charge(cpu_s)
            self.sampled += 1
        except Exception:  # an estimate must never lose the record
            self.failed += 1
            log.debug("rule advice estimate failed", exc_info=True)
        finally:
            if outcomes or signature is not None:
                record = replace(record, advice=outcomes, signature=signature)
            submit(record)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for the estimates in flight; cancel the rest (their records are still submitted)."""
        self._stopping = True
        if not self._tasks:
            return
        _, still_running = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in still_running:
            task.cancel()
        if still_running:
            await asyncio.gather(*still_running, return_exceptions=True)


def _signed(job: AdviceJob, key: bytes, prompt_tokens: int | None) -> tuple[PromptSignature, float]:
    """The request's prompt signature and the CPU seconds it took (run in a worker thread)."""
    started = time.thread_time()
    signature = prompt_signature(job.endpoint, job.body, key, prompt_tokens)
    return signature, time.thread_time() - started
