"""Turning one request into one `RequestRecord`, handed to the background writer without waiting.

A `RequestTracker` follows a request through the proxy in named stages (`Admitted`, `Parsed`, `Routed`, `Prepared`,
`Placed`, `Answered`: frozen values, each set once as the request path learns it); `finish` adds the explained stage
(the conversation link, the miss explanation and the prompt's hash chain) and builds the record exactly once,
whatever path the request took (success, upstream error, bad input, client disconnect). A record sampled for rule
advice or an uplift check is submitted by their background tasks once they have their answers; meanwhile the writer
holds it (`RecordSink.hold`: journaled under spill_first), so a crash while a sink has it loses nothing answered.

The recorder imports none of the features that feed it: the app composes it with its sinks (`MissExplainer`:
`gateway.explain.Explainer`; `UpliftSink`: `gateway.explain.uplift.UpliftChecker`; `AdviceSink`:
`gateway.advisor.sampler.AdviceSampler`), each declared in `gateway.record_sinks` by the calls the recorder makes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from db.records import RequestRecord
from gateway.explain.ledger import Routing, explained_fields
from gateway.metrics import GatewayMetrics
from gateway.record_sinks import (
    AdviceSink,
    ExplainedAnswer,
    HeldRecordLike,
    MissExplainer,
    RecordSink,
    UpliftSink,
)
from gateway.record_keys import KEY_VERSION, RecordHasher
from gateway.request_stages import (
    NOT_ADMITTED,
    NOT_PARSED,
    NOT_PLACED,
    NOT_PREPARED,
    NOT_ROUTED,
    Admitted,
    Answered,
    ConversationLinkLike,
    ExplainContextLike,
    Parsed,
    Placed,
    Prepared,
    Routed,
    StageSetTwice,
)
from gateway.upstreams.base import CacheReport, UsageReport
from gateway.upstreams.tiers import TierSplit

if TYPE_CHECKING:
    from gateway.telemetry.request_span import RequestSpan

log = logging.getLogger(__name__)

# Where a recorded TTFT comes from: the gateway's clock (first streamed content byte) or the engine's report.
TTFT_GATEWAY = "gateway"
TTFT_ENGINE = "engine"


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

    def record(self, record: RequestRecord, held: HeldRecordLike | None = None) -> None:
        """Count the record in the metrics and submit it (through `held` when the writer holds it for a sink)."""
        self._metrics.observe(record)
        try:
            # False means the writer's queue was full: the writer counts that record as dropped.
            if held is None:
                self._sink.submit(record)
            else:
                held.complete(record)
        except Exception:  # the request path must not fail because recording did
            log.exception("the record writer failed to take request %s", record.request_id)

    def hold(self, record: RequestRecord) -> HeldRecordLike | None:
        """Have the writer hold a record that a sink just took (None, logged, if it could not: the sink submits the
        record unheld then)."""
        try:
            return self._sink.hold(record)
        except Exception:
            log.exception("the record writer failed to hold request %s", record.request_id)
            return None

    def counters(self) -> Any:
        return self._sink.counters()


class RequestTracker:
    """One request's record, built in named stages as the request path learns them: admitted -> parsed -> routed ->
    prepared -> (placed) -> answered, each a frozen value set once through its method (a second set raises
    `StageSetTwice`); `finish` adds the explained stage (the recorder's explainer) and builds the `RequestRecord`
    once. A stage never reached keeps its empty value, so a request that failed early is recorded with what was
    known."""

    __slots__ = (
        "_recorder",
        "_start_perf",
        "request_id",
        "created_at",
        "endpoint",
        "span",
        "_admitted",
        "_parsed",
        "_routed",
        "_prepared",
        "_placed",
        "_answered",
        "finished",
    )

    def __init__(
        self,
        recorder: Recorder,
        request_id: str,
        endpoint: str,
        start_perf: float,
        *,
        created_at: datetime | None = None,
        span: RequestSpan | None = None,
    ) -> None:
        self._recorder = recorder
        self._start_perf = start_perf
        self.request_id = request_id
        self.created_at = created_at if created_at is not None else datetime.now(UTC)
        self.endpoint = endpoint
        self.span = span  # the request's OpenTelemetry span, when the gateway exports them
        self._admitted = NOT_ADMITTED
        self._parsed = NOT_PARSED
        self._routed = NOT_ROUTED
        self._prepared = NOT_PREPARED
        self._placed = NOT_PLACED
        self._answered: Answered | None = None
        self.finished = False

    def _set_twice(self, stage: str) -> None:
        raise StageSetTwice(f"request {self.request_id}: the {stage} stage was already recorded")

    def admitted(self, stage: Admitted) -> None:
        if self._admitted is not NOT_ADMITTED:
            self._set_twice("admitted")
        self._admitted = stage

    def parsed(self, stage: Parsed) -> None:
        if self._parsed is not NOT_PARSED:
            self._set_twice("parsed")
        self._parsed = stage

    def routed(self, stage: Routed) -> None:
        if self._routed is not NOT_ROUTED:
            self._set_twice("routed")
        self._routed = stage

    def prepared(self, stage: Prepared) -> None:
        if self._prepared is not NOT_PREPARED:
            self._set_twice("prepared")
        self._prepared = stage
        if stage.explain is not None:
            stage.explain.request_id = self.request_id

    def placed(self, stage: Placed) -> None:
        if self._placed is not NOT_PLACED:
            self._set_twice("placed")
        self._placed = stage

    def answered(self, stage: Answered) -> None:
        if self._answered is not None:
            self._set_twice("answered")
        self._answered = stage

    # What the request path reads back (stages are read-only once set).
    @property
    def tenant(self) -> str:
        return self._admitted.tenant

    @property
    def model(self) -> str:
        return self._parsed.model

    @property
    def prefix_hash(self) -> str | None:
        return self._prepared.prefix_hash

    @property
    def retention_class(self) -> str | None:
        """The class sent upstream, else the one the request asked for (Messages API), else None."""
        sent = self._prepared.retention_class
        return sent if sent is not None else self._parsed.retention_class

    @property
    def explain(self) -> ExplainContextLike | None:
        return self._prepared.explain

    @property
    def answer(self) -> Answered | None:
        """The answered stage (None until the upstream's answer was relayed)."""
        return self._answered

    def sending_upstream(self) -> None:
        """The request is about to go upstream: look up its nearest earlier request while the upstream works."""
        explainer = self._recorder.explainer
        explain = self._prepared.explain
        if explainer is not None and explain is not None:
            explainer.prepare_soon(explain)

    def _explained(self, status_code: int, report: CacheReport, prompt_tokens: int | None,
                   cached_tokens: int | None, completion_tokens: int | None, tiers: TierSplit | None,
                   ) -> tuple[ExplainedAnswer | None, ConversationLinkLike | None]:
        """The explained stage: the recorder's explainer's answer and the request's conversation link (None, None
        without an explainer or explain context). The engine's counts are the record's (the usage's, else the
        headers'), so that the token ledger adds up to the recorded prompt tokens."""
        explainer = self._recorder.explainer
        explain = self._prepared.explain
        if explainer is None or explain is None:
            return None, None
        placed = self._placed
        explain.replica = placed.replica
        explain.computed_tokens = None if prompt_tokens is None else prompt_tokens + (completion_tokens or 0)
        link = explainer.conversation(explain, recorded_status=status_code)
        engine = replace(report, matched_tokens=cached_tokens, prompt_tokens=prompt_tokens)
        withheld = 0
        if cached_tokens is not None and report.matched_tokens is not None and prompt_tokens is not None \
                and cached_tokens < report.matched_tokens <= prompt_tokens:
            # The client's API reads less than the engine matched (Messages API breakpoints): the ledger is made on
            # the engine's match and the rest is withheld.
            withheld = report.matched_tokens - cached_tokens
            engine = replace(engine, matched_tokens=report.matched_tokens)
        routing = Routing(placed.predicted_match_tokens, placed.best_other_match_tokens)
        routing = routing.with_previous_turn(link, placed.replica)
        explained = explainer.explain(explain, recorded_status=status_code, engine=engine,
                                      applied_rules=self._prepared.applied_rules, conversation=link, routing=routing,
                                      tiers=tiers, withheld_tokens=withheld)
        return explained, link

    def finish(self, status_code: int, error_type: str | None = None) -> None:
        """Record the request (only the first call counts)."""
        if self.finished:
            return
        self.finished = True
        latency_ms = (time.perf_counter() - self._start_perf) * 1000.0
        admitted, parsed, prepared, placed = self._admitted, self._parsed, self._prepared, self._placed
        answer = self._answered
        usage = (answer.usage if answer is not None else None) or UsageReport()
        report = (answer.cache_report if answer is not None else None) or CacheReport()
        gateway_ttft = answer.ttft_ms if answer is not None else None
        diagnosis = answer.provider_diagnosis if answer is not None else None
        prompt_tokens = usage.prompt_tokens if usage.prompt_tokens is not None else report.prompt_tokens
        cached_tokens = usage.cached_tokens if usage.cached_tokens is not None else report.matched_tokens
        # The body's split (or the usage chunk's) wins over the header's; the load time is only ever in the body.
        tiers = usage.tiers if usage.tiers is not None else report.tiers
        explained, link = self._explained(status_code, report, prompt_tokens, cached_tokens,
                                          usage.completion_tokens, tiers)
        ttft_ms, ttft_source = gateway_ttft, TTFT_GATEWAY if gateway_ttft is not None else None
        if ttft_ms is None and not parsed.stream and report.ttft_ms is not None and status_code < 400:
            ttft_ms, ttft_source = report.ttft_ms, TTFT_ENGINE  # the engine's own queue + prefill time
        hasher = self._recorder.hasher
        chain = None if explained is None else explained.chain
        record = RequestRecord(
            request_id=self.request_id,
            created_at=self.created_at,
            tenant=admitted.tenant,
            key_id=admitted.key_id,
            endpoint=self.endpoint,
            model=parsed.model,
            upstream=self._routed.upstream,
            stream=parsed.stream,
            status_code=status_code,
            error_type=error_type,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            completion_tokens=usage.completion_tokens,
            ttft_ms=ttft_ms,
            ttft_source=ttft_source,
            latency_ms=latency_ms,
            applied_rules=prepared.applied_rules,
            miss_kind=report.miss_kind,
            prefix_hash=prepared.prefix_hash,
            prompt_text=prepared.prompt_text,
            template_tokens=report.template_tokens,
            namespace_label=prepared.namespace_label,
            chain=chain if hasher is None else hasher.chain(admitted.tenant, chain),
            hash_key_version=None if hasher is None else KEY_VERSION,
            cache_write_tokens=answer.cache_write_tokens if answer is not None else None,
            retention_class=self.retention_class,
            cached_tokens_device=None if tiers is None else tiers.device_tokens,
            cached_tokens_host=None if tiers is None else tiers.host_tokens,
            cached_tokens_disk=None if tiers is None else tiers.disk_tokens,
            cache_load_ms=usage.cache_load_ms,
            replica=placed.replica,
            routing_policy=placed.routing_policy,
            predicted_match_tokens=placed.predicted_match_tokens,
            routing_index_source=placed.routing_index_source,
            provider_miss_reason=None if diagnosis is None else diagnosis.reason,
            provider_missed_tokens=None if diagnosis is None else diagnosis.missed_tokens,
            **explained_fields(explained, report, prompt_tokens, cached_tokens, tiers),
            **({} if link is None else link.record_fields()),
        )
        if self.span is not None:
            self.span.end(record)
        _Handoff(self._recorder, None if explained is None else explained.uplift).start(self.explain, record)


class _Handoff:
    """A finished record on its way through the sinks that add to it (rule advice, then an uplift check) to the writer.

    When a sink takes the record, the writer holds it at once (the sink's task runs later on the event loop, so the
    record is held before the sink can complete it); the last sink's task submits the completed version through that
    hold. A sink that completes the record before it returns (the demo's) leaves nothing to hold."""

    __slots__ = ("_recorder", "_uplift_job", "_held", "_submitted")

    def __init__(self, recorder: Recorder, uplift_job: Any) -> None:
        self._recorder = recorder
        self._uplift_job = uplift_job
        self._held: HeldRecordLike | None = None
        self._submitted = False

    def start(self, context: Any, record: RequestRecord) -> None:
        advisor = self._recorder.advisor
        if advisor is not None and advisor.observe(context, record, self._after_advice):
            self._hold(record)
            return
        self._after_advice(record)

    def _after_advice(self, record: RequestRecord) -> None:
        uplift = self._recorder.uplift
        if self._uplift_job is not None and uplift is not None and uplift.defer(record, self._uplift_job, self._submit):
            self._hold(record)
            return
        self._submit(record)

    def _hold(self, record: RequestRecord) -> None:
        if self._held is None and not self._submitted:  # held once, from the first sink to the writer
            self._held = self._recorder.hold(record)

    def _submit(self, record: RequestRecord) -> None:
        self._submitted = True
        self._recorder.record(record, self._held)
