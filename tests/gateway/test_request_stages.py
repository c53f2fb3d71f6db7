"""A request's record is built from its stages, each set once (`gateway.recording.RequestTracker`)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from db.records import UNAUTHENTICATED_TENANT, RequestRecord
from gateway.metrics import GatewayMetrics
from gateway.recording import TTFT_ENGINE, TTFT_GATEWAY, Recorder, RequestTracker
from gateway.request_stages import (
    Admitted,
    Answered,
    Outcome,
    Parsed,
    Placed,
    Prepared,
    Routed,
    StageSetTwice,
)
from gateway.upstreams.base import CacheReport, UsageReport


class _Sink:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def submit(self, record: RequestRecord) -> bool:
        self.records.append(record)
        return True

    def counters(self) -> None:
        return None


@pytest.fixture(scope="module")
def metrics() -> GatewayMetrics:
    return GatewayMetrics()


def _tracker(metrics: GatewayMetrics) -> tuple[RequestTracker, _Sink]:
    sink = _Sink()
    return RequestTracker(Recorder(sink, metrics), "req_1", "chat", time.perf_counter()), sink


def test_the_record_is_built_from_every_stage(metrics: GatewayMetrics) -> None:
    tracker, sink = _tracker(metrics)
    tracker.admitted(Admitted("acme", "key1"))
    tracker.parsed(Parsed("m", True, retention_class="1h"))
    tracker.routed(Routed("local"))
    tracker.prepared(Prepared(("strip_dates",), "abc", "hello", "ns1", None, None))
    replica = SimpleNamespace(url="http://r1")
    placement = SimpleNamespace(replica=replica, policy="cache_aware", predicted_match_tokens=7, index_source="events",
                                best_other_match_tokens=None)
    tracker.placed(Placed.of(placement, failovers=1))
    usage = UsageReport(prompt_tokens=10, cached_tokens=4, completion_tokens=3)
    report = CacheReport(miss_kind="partial", template_tokens=2)
    tracker.answered(Answered(Outcome(200), usage, report, ttft_ms=12.5, cache_write_tokens=6))
    tracker.finish(200)
    tracker.finish(500, "late")  # only the first finish counts
    (record,) = sink.records
    assert (record.tenant, record.key_id, record.model, record.stream, record.upstream) == (
        "acme", "key1", "m", True, "local"
    )
    assert record.applied_rules == ("strip_dates",) and record.prefix_hash == "abc" and record.prompt_text == "hello"
    assert record.namespace_label == "ns1"
    assert record.retention_class == "1h"  # none was sent: the class the request asked for
    assert (record.replica, record.routing_policy, record.predicted_match_tokens, record.routing_index_source) == (
        "http://r1", "cache_aware", 7, "events"
    )
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (10, 4, 3)
    assert (record.ttft_ms, record.ttft_source) == (12.5, TTFT_GATEWAY)
    assert record.miss_kind == "partial" and record.template_tokens == 2 and record.cache_write_tokens == 6
    assert (record.status_code, record.error_type) == (200, None)


def test_the_class_sent_upstream_wins_over_the_class_asked_for(metrics: GatewayMetrics) -> None:
    tracker, sink = _tracker(metrics)
    tracker.parsed(Parsed("m", False, retention_class="1h"))
    tracker.prepared(Prepared(retention_class="5m"))
    tracker.answered(Answered(Outcome(200), cache_report=CacheReport(ttft_ms=3.0)))
    tracker.finish(200)
    (record,) = sink.records
    assert record.retention_class == "5m"
    assert (record.ttft_ms, record.ttft_source) == (3.0, TTFT_ENGINE)  # not streamed: the engine's own TTFT


def test_a_request_that_ended_early_is_recorded_with_what_was_known(metrics: GatewayMetrics) -> None:
    tracker, sink = _tracker(metrics)
    tracker.admitted(Admitted("acme", "key1"))
    tracker.finish(400, "invalid_request_error")
    (record,) = sink.records
    assert (record.tenant, record.model, record.upstream, record.applied_rules) == ("acme", "", "", ())
    assert (record.replica, record.prompt_tokens, record.ttft_ms) == (None, None, None)
    assert (record.status_code, record.error_type) == (400, "invalid_request_error")
    unauthenticated, sink = _tracker(metrics)
    unauthenticated.finish(401, "authentication_error")
    assert sink.records[0].tenant == UNAUTHENTICATED_TENANT


@pytest.mark.parametrize(
    "stage",
    [
        Admitted("acme", None),
        Parsed("m", False),
        Routed("local"),
        Prepared(),
        Placed(None, None, None, None),
        Answered(Outcome(200)),
    ],
    ids=lambda stage: type(stage).__name__,
)
def test_a_stage_set_twice_raises(metrics: GatewayMetrics, stage: object) -> None:
    tracker, _ = _tracker(metrics)
    setter = getattr(tracker, {"Admitted": "admitted", "Parsed": "parsed", "Routed": "routed", "Prepared": "prepared",
                               "Placed": "placed", "Answered": "answered"}[type(stage).__name__])
    setter(stage)
    with pytest.raises(StageSetTwice):
        setter(stage)


def test_stages_are_frozen_and_the_tracker_takes_no_loose_attributes(metrics: GatewayMetrics) -> None:
    tracker, _ = _tracker(metrics)
    stage = Parsed("m", False)
    with pytest.raises(AttributeError):
        stage.model = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        tracker.model = "m"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        tracker.usage = UsageReport()  # type: ignore[attr-defined]
