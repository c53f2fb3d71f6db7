"""Turning one request into one `RequestRecord`, handed to the background writer without waiting.

A `RequestTracker` follows a request through the proxy, collecting what is known as it becomes known; `finish`
builds the record exactly once, whatever path the request took (success, upstream error, bad input, client
disconnect), so every request is recorded. For an answered request the record carries the miss explanation and the
prompt's hash chain; when the request was sampled for rule advice or a normalization uplift check, their background
tasks submit the record once they have their answers.

The recorder imports none of the features that feed it: the app composes it with its sinks (`MissExplainer`:
`gateway.explain.Explainer`; `UpliftSink`: `gateway.explain.uplift.UpliftChecker`; `AdviceSink`:
`gateway.advisor.sampler.AdviceSampler`), each declared here by the calls the recorder makes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from db.chains import RequestChain
from db.records import UNAUTHENTICATED_TENANT, RequestRecord
from gateway.metrics import GatewayMetrics
from gateway.provider_diagnostics import ProviderDiagnosis
from gateway.record_keys import KEY_VERSION, RecordHasher
from gateway.upstreams.base import CacheReport, UsageReport

if TYPE_CHECKING:
    from gateway.telemetry.request_span import RequestSpan

log = logging.getLogger(__name__)

# Where a recorded TTFT comes from: the gateway's clock (first streamed content byte) or the engine's report.
TTFT_GATEWAY = "gateway"
TTFT_ENGINE = "engine"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended, as recorded: the status code sent to the client and the error type, if any."""

    status_code: int
    error_type: str | None = None


class RecordSink(Protocol):
    """What the recorder hands records to: `db.writer.RecordWriter` in production."""

    def submit(self, record: RequestRecord) -> bool: ...

    def counters(self) -> Any: ...


class ExplainContextLike(Protocol):
    """What the recorder reads or tells about a request's explain context (`gateway.explain.ExplainContext`)."""

    route: Any  # the route the request took: a replica set's placement replaces it


class ExplainedAnswer(Protocol):
    """A miss explanation (`gateway.explain.explainer.Explained`)."""

    @property
    def chain(self) -> RequestChain | None: ...

    @property
    def uplift(self) -> Any: ...  # the uplift check to run, when the request was sampled for one

    def record_fields(self, report: CacheReport) -> Mapping[str, Any]: ...


class MissExplainer(Protocol):
    """Explains why an answered request was not served further from cache (`gateway.explain.Explainer`)."""

    def prepare_soon(self, context: Any) -> None: ...

    def explain(
        self, context: Any, *, recorded_status: int, engine: CacheReport, applied_rules: tuple[str, ...]
    ) -> ExplainedAnswer: ...


class UpliftSink(Protocol):
    """Measures a sampled request's normalization gain, then submits its record (`UpliftChecker`)."""

    def defer(self, record: RequestRecord, job: Any) -> bool: ...


class AdviceSink(Protocol):
    """Estimates what a tenant's disabled rules would gain, then submits the record (`AdviceSampler`)."""

    def observe(self, context: Any, record: RequestRecord, submit: Callable[[RequestRecord], None]) -> bool: ...


class Recorder:
    """Submits finished records to the writer (never blocking) and counts them in the metrics; holds the sinks that
    add to a record before it is submitted (each None: that part is left out)."""

    def __init__(
        self,
        sink: RecordSink,
        metrics: GatewayMetrics,
        hasher: RecordHasher | None = None,
    ) -> None:
        self._sink = sink
        self._metrics = metrics
        self.hasher = hasher  # keys the stored prompt hashes (None: plain hashes, for tests of other parts only)
        self.explainer: MissExplainer | None = None
        self.uplift: UpliftSink | None = None
        self.advisor: AdviceSink | None = None

    def compose(
        self,
        *,
        explainer: MissExplainer | None = None,
        uplift: UpliftSink | None = None,
        advisor: AdviceSink | None = None,
    ) -> None:
        """Attach the sinks (composed by the app after the recorder: they submit the records they hold back)."""
        self.explainer, self.uplift, self.advisor = explainer, uplift, advisor

    def hash_key(self, tenant: str) -> bytes:
        """The tenant's record key for `prefix_hash` (empty without a hasher)."""
        return b"" if self.hasher is None else self.hasher.key_for(tenant)

    def record(self, record: RequestRecord) -> None:
        self._metrics.observe(record)
        try:
            # False means the writer's queue was full: the writer counts that record as dropped.
            self._sink.submit(record)
        except Exception:  # the request path must not fail because recording did
            log.exception("the record writer failed to take request %s", record.request_id)

    def counters(self) -> Any:
        return self._sink.counters()


class RequestTracker:
    """Mutable per-request state; `finish` turns it into a record once."""

    __slots__ = (
        "_recorder",
        "_start_perf",
        "request_id",
        "created_at",
        "endpoint",
        "tenant",
        "key_id",
        "model",
        "upstream",
        "stream",
        "applied_rules",
        "prefix_hash",
        "prompt_text",
        "usage",
        "cache_report",
        "ttft_ms",
        "outcome",
        "finished",
        "explain",
        "namespace_label",
        "cache_write_tokens",
        "retention_class",
        "replica",
        "routing_policy",
        "predicted_match_tokens",
        "routing_index_source",
        "failovers",
        "provider_diagnosis",
        "span",
    )

    def __init__(self, recorder: Recorder, request_id: str, endpoint: str, start_perf: float) -> None:
        self._recorder = recorder
        self._start_perf = start_perf
        self.request_id = request_id
        self.created_at = datetime.now(UTC)
        self.endpoint = endpoint
        self.tenant = UNAUTHENTICATED_TENANT
        self.key_id: str | None = None
        self.model = ""
        self.upstream = ""
        self.stream = False
        self.applied_rules: tuple[str, ...] = ()
        self.prefix_hash: str | None = None
        self.prompt_text: str | None = None
        self.usage: UsageReport | None = None
        self.cache_report: CacheReport | None = None
        self.ttft_ms: float | None = None
        # Set just before the last response byte is sent, so a client that leaves right after the end of its
        # response (it saw `[DONE]`) is still recorded with the real outcome.
        self.outcome: Outcome | None = None
        self.finished = False
        self.explain: ExplainContextLike | None = None  # what the explainer knows of the request
        self.namespace_label: str | None = None  # the engine's label of the tenant's cache namespace
        # Messages API only: prompt tokens written to the cache.
        self.cache_write_tokens: int | None = None
        # The retention class sent upstream (`gateway.retention`), or on the Messages API the one its breakpoints ask
        # for; None when none applies.
        self.retention_class: str | None = None
        self.replica: str | None = None
        self.routing_policy: str | None = None
        self.predicted_match_tokens: int | None = None
        self.routing_index_source: str | None = None
        self.failovers = 0
        # The upstream provider's own prompt-cache diagnosis, when it returned one (`gateway.provider_diagnostics`).
        self.provider_diagnosis: ProviderDiagnosis | None = None
        self.span: RequestSpan | None = None  # the request's OpenTelemetry span, when the gateway exports them

    def placed(self, placement: Any) -> None:
        """A replica set chose where this request goes (`gateway.replicas.replica_set.Placement`)."""
        self.replica = placement.replica.url if placement.replica is not None else None
        self.routing_policy = placement.policy
        self.predicted_match_tokens = placement.predicted_match_tokens
        self.routing_index_source = placement.index_source
        if self.explain is not None:
            self.explain.route = placement.route  # the uplift check asks the replica that served the request

    def sending_upstream(self) -> None:
        """The request is about to go upstream: look up its nearest earlier request while the upstream works."""
        explainer = self._recorder.explainer
        if explainer is not None and self.explain is not None:
            explainer.prepare_soon(self.explain)

    def finish(self, status_code: int, error_type: str | None = None) -> None:
        """Record the request (only the first call counts)."""
        if self.finished:
            return
        self.finished = True
        latency_ms = (time.perf_counter() - self._start_perf) * 1000.0
        usage = self.usage or UsageReport()
        report = self.cache_report or CacheReport()
        prompt_tokens = usage.prompt_tokens if usage.prompt_tokens is not None else report.prompt_tokens
        cached_tokens = usage.cached_tokens if usage.cached_tokens is not None else report.matched_tokens
        # The body's split (or the usage chunk's) wins over the header's; the load time is only ever in the body.
        tiers = usage.tiers if usage.tiers is not None else report.tiers
        explainer = self._recorder.explainer
        explained: ExplainedAnswer | None = None
        if explainer is not None and self.explain is not None:
            engine = replace(
                report,
                matched_tokens=report.matched_tokens if report.matched_tokens is not None else cached_tokens,
                prompt_tokens=report.prompt_tokens if report.prompt_tokens is not None else prompt_tokens,
            )
            explained = explainer.explain(
                self.explain, recorded_status=status_code, engine=engine, applied_rules=self.applied_rules
            )
        ttft_ms, ttft_source = self.ttft_ms, TTFT_GATEWAY if self.ttft_ms is not None else None
        if ttft_ms is None and not self.stream and report.ttft_ms is not None and status_code < 400:
            ttft_ms, ttft_source = report.ttft_ms, TTFT_ENGINE  # the engine's own queue + prefill time
        hasher = self._recorder.hasher
        chain = None if explained is None else explained.chain
        record = RequestRecord(
            request_id=self.request_id,
            created_at=self.created_at,
            tenant=self.tenant,
            key_id=self.key_id,
            endpoint=self.endpoint,
            model=self.model,
            upstream=self.upstream,
            stream=self.stream,
            status_code=status_code,
            error_type=error_type,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            completion_tokens=usage.completion_tokens,
            ttft_ms=ttft_ms,
            ttft_source=ttft_source,
            latency_ms=latency_ms,
            applied_rules=self.applied_rules,
            miss_kind=report.miss_kind,
            prefix_hash=self.prefix_hash,
            prompt_text=self.prompt_text,
            template_tokens=report.template_tokens,
            namespace_label=self.namespace_label,
            chain=chain if hasher is None else hasher.chain(self.tenant, chain),
            hash_key_version=None if hasher is None else KEY_VERSION,
            cache_write_tokens=self.cache_write_tokens,
            retention_class=self.retention_class,
            cached_tokens_device=None if tiers is None else tiers.device_tokens,
            cached_tokens_host=None if tiers is None else tiers.host_tokens,
            cached_tokens_disk=None if tiers is None else tiers.disk_tokens,
            cache_load_ms=usage.cache_load_ms,
            replica=self.replica,
            routing_policy=self.routing_policy,
            predicted_match_tokens=self.predicted_match_tokens,
            routing_index_source=self.routing_index_source,
            provider_miss_reason=None if self.provider_diagnosis is None else self.provider_diagnosis.reason,
            provider_missed_tokens=None if self.provider_diagnosis is None else self.provider_diagnosis.missed_tokens,
            **({} if explained is None else explained.record_fields(report)),
        )
        if self.span is not None:
            self.span.end(record)
        recorder = self._recorder

        def submit(record: RequestRecord) -> None:
            job = None if explained is None else explained.uplift
            if job is not None and recorder.uplift is not None and recorder.uplift.defer(record, job):
                return  # the check's task submits the record
            recorder.record(record)

        if recorder.advisor is not None and recorder.advisor.observe(self.explain, record, submit):
            return  # the rule advisor's task submits the record
        submit(record)
