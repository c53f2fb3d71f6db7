"""The advisor's background sampler: every request while the advisor has capacity, none past it.

Every answered request of a tenant whose `advice_sample_rate` is above 0 (0 turns advice off) joins its tenant's
history (a reference, nothing copied; a tenant with advice off keeps none). It is sampled whenever the advisor has
capacity (`gateway.advisor.capacity`: under its CPU budget, a share of one core over a sliding window, and fewer than
`max_pending` estimates queued or running), not by a fixed fraction, so a quiet tenant is advised after its first
handful of requests and a busy gateway stays bounded. Taking a sample on the request's own turn of the event loop
costs only a check and a queue entry: its record is held (the writer journals it: see `db.held_record`) and the
sample waits in a bounded queue, which `concurrency` background workers (one by default) drain one estimate
(`gateway.advisor.estimate`) at a time; the record is then submitted with the estimates attached, so the client
never waits. One tenant may hold at most three quarters of the queue, so a busy tenant leaves room for the others.
A request that finds no room is not sampled (counted in `skipped`).

Each estimate is charged its whole CPU time: its steps on the event loop (`gateway.advisor.metered`: the dry runs'
payloads, JSON and HTTP work) and its worker-thread parts. A worker paces itself by the budget, resting after each
estimate (and its thread after each rewrite) in proportion to the CPU it used, so the advisor's work comes in
small slices between the requests' own steps rather than in bursts that they would wait behind. Each estimate
compares against at most `scan_limit` earlier requests and does its rewriting in a worker thread, so neither the
history size nor the rules slow the event loop. With a fleet key, a sampled record also carries its prompt's keyed
signature (`gateway.advisor.signature`) for the fleet patterns. `stop` runs the queued estimates without resting,
waits (bounded) for them and submits the records of any it has to cancel, without advice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import httpx

from db.advice import AdviceOutcome
from db.signatures import PromptSignature
from db.records import RequestRecord
from gateway.advisor.capacity import DEFAULT_CPU_BUDGET, DEFAULT_MAX_PENDING, DEFAULT_WINDOW_S, AdvisorCapacity
from gateway.advisor.candidates import Candidate, candidates_for, settings_fingerprint
from gateway.advisor.estimate import DEFAULT_SCAN_LIMIT, AdviceJob, Estimator
from gateway.advisor.history import DEFAULT_HISTORY_SIZE, AdviceHistories, Entry
from gateway.advisor.metered import Metered
from gateway.advisor.signature import prompt_signature
from gateway.config.tenant import TenantSettings
from gateway.explain.explainer import ExplainContext
from gateway.normalize.pipeline import Pipeline, build_pipeline

log = logging.getLogger(__name__)

Submit = Callable[[RequestRecord], None]


@dataclass(frozen=True, slots=True)
class _Sample:
    """A sampled request waiting for its estimate: the job, the held record and where to submit it."""

    tenant: str
    job: AdviceJob
    record: RequestRecord
    submit: Submit


class AdviceSampler:
    """Samples answered requests and estimates, off the request path, what each candidate rule would gain."""

    def __init__(
        self,
        client: Callable[[], httpx.AsyncClient],
        *,
        concurrency: int = 1,
        max_pending: int = DEFAULT_MAX_PENDING,
        history_size: int = DEFAULT_HISTORY_SIZE,
        scan_limit: int = DEFAULT_SCAN_LIMIT,
        timeout_s: float = 10.0,
        cpu_budget: float = DEFAULT_CPU_BUDGET,
        window_s: float = DEFAULT_WINDOW_S,
        fleet_key: bytes = b"",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._client = client
        self._fleet_key = fleet_key  # keys the prompt signatures of the fleet patterns (empty: none are taken)
        self._concurrency = concurrency
        self.capacity = AdvisorCapacity(cpu_budget, window_s, max_pending, clock)
        self._timeout = httpx.Timeout(timeout_s)
        self.histories = AdviceHistories(history_size)
        self._scan_limit = scan_limit
        self._pipelines: dict[TenantSettings, Pipeline] = {}
        self._fingerprints: dict[TenantSettings, str] = {}
        self._candidate_sets: dict[TenantSettings, tuple[Candidate, ...]] = {}
        self._queue: deque[_Sample] = deque()
        self._running = 0  # estimates started and not yet finished
        self._tenant_limit = max(1, max_pending * 3 // 4)  # samples one tenant may have queued or running
        self._pending_by_tenant: dict[str, int] = {}
        self._workers: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()  # set by `stop`: a resting worker goes on at once
        self._stopping = False
        self.sampled = 0
        self.failed = 0
        self.skipped = 0

    @property
    def pending(self) -> int:
        """Sampled requests whose estimate is queued or running."""
        return len(self._queue) + self._running

    def observe(self, context: ExplainContext | None, record: RequestRecord, submit: Submit) -> bool:
        """Remember an answered request; when it is sampled, queue its estimate and return True (a worker then
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
        entry = Entry(context.endpoint, context.raw_body, context.body)
        if record.prompt_tokens is None or record.cached_tokens is None:
            history.add(entry)
            return False
        candidates = self._candidates(settings)
        if not candidates:
            history.add(entry)
            return False
        tenant_pending = self._pending_by_tenant.get(context.tenant, 0)
        if self._stopping or tenant_pending >= self._tenant_limit or not self.capacity.has_room(self.pending):
            self.skipped += 1
            history.add(entry)
            return False
        earlier = history.snapshot()  # the requests before this one (a tuple of references), taken only for a sample
        history.add(entry)
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
        self._queue.append(_Sample(context.tenant, job, record, submit))
        self._pending_by_tenant[context.tenant] = tenant_pending + 1
        if len(self._workers) < self._concurrency:
            worker = asyncio.get_running_loop().create_task(self._drain())
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)
        return True

    def _candidates(self, settings: TenantSettings) -> tuple[Candidate, ...]:
        found = self._candidate_sets.get(settings)
        if found is None:
            found = self._candidate_sets[settings] = candidates_for(settings)
        return found

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

    async def _drain(self) -> None:
        """One worker: the queued samples one at a time, resting between them as the capacity's pace says."""
        try:
            while self._queue:
                rest = self.capacity.rest_s()
                if rest > 0 and not self._stopping:
                    try:
                        await asyncio.wait_for(self._wake.wait(), rest)
                    except TimeoutError:
                        pass
                    continue  # the queue may have been emptied by another worker meanwhile
                sample = self._queue.popleft()
                self._running += 1
                try:
                    await self._run(sample)
                finally:
                    self._running -= 1
                    self._done(sample)
        finally:
            # Leave the set in the same step as the queue was found empty (a done callback would run later, and a
            # sample queued meanwhile would find no worker to start).
            self._workers.discard(asyncio.current_task())  # type: ignore[arg-type]

    async def _run(self, sample: _Sample) -> None:
        job, record = sample.job, sample.record
        outcomes: tuple[AdviceOutcome, ...] = ()
        signature = None
        estimator = Estimator(job, self._client(), self._timeout, self.capacity.rest_after)
        work = Metered(self._estimate(estimator, job, record.prompt_tokens))
        try:
            outcomes, signature, thread_cpu_s = await work
            self.capacity.charge(work.cpu_s + thread_cpu_s)
            self.sampled += 1
        except Exception:  # an estimate must never lose the record
            self.capacity.charge(work.cpu_s + estimator.cpu_s)
            self.failed += 1
            log.debug("rule advice estimate failed", exc_info=True)
        finally:
            if outcomes or signature is not None:
                record = replace(record, advice=outcomes, signature=signature)
            sample.submit(record)

    async def _estimate(
        self, estimator: Estimator, job: AdviceJob, prompt_tokens: int | None
    ) -> tuple[tuple[AdviceOutcome, ...], PromptSignature | None, float]:
        """The outcomes, the signature (with a fleet key) and the CPU seconds spent in worker threads."""
        outcomes = await estimator.outcomes()
        thread_cpu_s = estimator.cpu_s
        signature = None
        if self._fleet_key:
            signature, cpu_s = await asyncio.to_thread(_signed, job, self._fleet_key, prompt_tokens)
            thread_cpu_s += cpu_s
        return outcomes, signature, thread_cpu_s

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Run the queued estimates without resting and wait (bounded) for them; cancel the rest (their records are
        still submitted, without advice)."""
        self._stopping = True
        self._wake.set()
        if self._workers:
            _, still_running = await asyncio.wait(set(self._workers), timeout=timeout_s)
            for task in still_running:
                task.cancel()
            if still_running:
                await asyncio.gather(*still_running, return_exceptions=True)
        while self._queue:
            sample = self._queue.popleft()
            self._done(sample)
            sample.submit(sample.record)

    def _done(self, sample: _Sample) -> None:
        left = self._pending_by_tenant.pop(sample.tenant) - 1
        if left:
            self._pending_by_tenant[sample.tenant] = left


def _signed(job: AdviceJob, key: bytes, prompt_tokens: int | None) -> tuple[PromptSignature, float]:
    """The request's prompt signature and the CPU seconds it took (run in a worker thread)."""
    started = time.thread_time()
    signature = prompt_signature(job.endpoint, job.body, key, prompt_tokens)
    return signature, time.thread_time() - started
