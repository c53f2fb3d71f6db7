"""The recorder's hand-off through the sinks that add to a record (rule advice, then an uplift check): the writer holds
the record from the moment its request finishes until the last sink completes it, once, with what each sink added."""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from db.held_record import HeldRecord
from db.records import RequestRecord
from gateway.metrics import GatewayMetrics
from gateway.recording import Recorder, RequestTracker
from gateway.request_stages import Prepared


class JournalingSink:
    """Logs what the recorder asks of the writer, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def submit(self, record: RequestRecord) -> bool:
        self.calls.append(("submit", record.request_id, record))
        return True

    def hold(self, record: RequestRecord) -> HeldRecord:
        self.calls.append(("hold", record.request_id, record))

        def release() -> None:
            self.calls.append(("release", record.request_id, None))

        return HeldRecord(record.request_id, self.submit, release)

    def counters(self) -> Any:
        return None


class Explained:
    chain = None
    uplift = "the uplift job"

    def record_fields(self, report: Any) -> dict[str, Any]:
        return {}


class Explainer:
    def prepare_soon(self, context: Any) -> None:
        pass

    def conversation(self, context: Any, **_: Any) -> None:
        return None

    def explain(self, context: Any, **_: Any) -> Explained:
        return Explained()


class LaterSink:
    """Takes every record and keeps the callback its background task would call later."""

    def __init__(self) -> None:
        self.waiting: list[tuple[RequestRecord, Any]] = []

    def observe(self, context: Any, record: RequestRecord, submit: Any) -> bool:
        self.waiting.append((record, submit))
        return True

    def defer(self, record: RequestRecord, job: Any, submit: Any) -> bool:
        self.waiting.append((record, submit))
        return True


class AtOnceUplift:
    """Completes the record before it returns (as the demo's dry-run uplift does)."""

    def defer(self, record: RequestRecord, job: Any, submit: Any) -> bool:
        submit(replace(record, normalization_gain_tokens=2))
        return True


def _finish(recorder: Recorder) -> str:
    tracker = RequestTracker(recorder, f"req-{time.perf_counter_ns()}", "chat.completions", time.perf_counter())
    tracker.prepared(Prepared(explain=SimpleNamespace(route=None)))
    tracker.finish(200)
    return tracker.request_id


def test_a_record_is_held_from_finish_through_both_sinks_and_completed_once() -> None:
    sink = JournalingSink()
    recorder = Recorder(sink, GatewayMetrics())
    advisor, uplift = LaterSink(), LaterSink()
    recorder.compose(explainer=Explainer(), uplift=uplift, advisor=advisor)  # type: ignore[arg-type]
    request_id = _finish(recorder)
    assert [(call, rid) for call, rid, _ in sink.calls] == [("hold", request_id)]  # held as the request finished
    ((record, advised),) = advisor.waiting
    advised(replace(record, completion_tokens=9))  # the estimate is attached: on to the uplift check
    assert [call for call, _, _ in sink.calls] == ["hold"]  # still held, now by the uplift check
    ((record, checked),) = uplift.waiting
    checked(replace(record, normalization_gain_tokens=4))
    assert [call for call, _, _ in sink.calls] == ["hold", "submit", "release"]
    stored = sink.calls[1][2]
    assert (stored.request_id, stored.completion_tokens, stored.normalization_gain_tokens) == (request_id, 9, 4)


def test_a_sink_that_completes_at_once_leaves_nothing_held() -> None:
    sink = JournalingSink()
    recorder = Recorder(sink, GatewayMetrics())
    recorder.compose(explainer=Explainer(), uplift=AtOnceUplift())  # type: ignore[arg-type]
    request_id = _finish(recorder)
    assert [(call, rid) for call, rid, _ in sink.calls] == [("submit", request_id)]
    assert sink.calls[0][2].normalization_gain_tokens == 2
