"""What the recorder (`gateway.recording`) calls on the parts that receive and add to its records, declared by those
calls so that the recorder imports none of them: the writer (`RecordSink`), the explainer (`MissExplainer`), the
uplift checker (`UpliftSink`) and the rule advisor (`AdviceSink`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from db.chains import RequestChain
from db.records import RequestRecord
from gateway.explain.ledger import Routing
from gateway.request_stages import ConversationLinkLike
from gateway.upstreams.base import CacheReport
from gateway.upstreams.tiers import TierSplit


class HeldRecordLike(Protocol):
    """A record held back by a sink (`db.held_record.HeldRecord`)."""

    def complete(self, record: RequestRecord) -> bool: ...


class RecordSink(Protocol):
    """What the recorder hands records to: `db.writer.RecordWriter` in production."""

    def submit(self, record: RequestRecord) -> bool: ...

    def hold(self, record: RequestRecord) -> HeldRecordLike: ...

    def counters(self) -> Any: ...


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

    def conversation(self, context: Any, *, recorded_status: int) -> ConversationLinkLike | None: ...

    def explain(
        self, context: Any, *, recorded_status: int, engine: CacheReport, applied_rules: tuple[str, ...],
        conversation: ConversationLinkLike | None = None, routing: Routing | None = None,
        tiers: TierSplit | None = None,
    ) -> ExplainedAnswer: ...


class UpliftSink(Protocol):
    """Measures a sampled request's normalization gain, then submits its record (`UpliftChecker`)."""

    def defer(self, record: RequestRecord, job: Any, submit: Callable[[RequestRecord], None]) -> bool: ...


class AdviceSink(Protocol):
    """Estimates what a tenant's disabled rules would gain, then submits the record (`AdviceSampler`)."""

    def observe(self, context: Any, record: RequestRecord, submit: Callable[[RequestRecord], None]) -> bool: ...
