"""How a program's span export tells its log that the collector cannot be reached: one warning when exports start
failing (with the first failure's reason), one info line when an export succeeds again (how many exports and spans
failed meanwhile), and nothing for each failed export in between. Every failure stays counted in the program's
`/metrics` (`<prefix>_trace_spans_total{outcome="failed"}`, `prefixscope.tracing.ExportMetrics`).

The OTLP exporter logs each failed attempt itself: a warning per retry and an error per batch (older versions a
traceback per connection error). `held_back_exporter_logs` keeps those records out of the log while one export of
ours runs, in the thread that runs it, and hands their messages over as the failure's reason; the exporter's other
records (outside our exports, or from other threads) pass as before.

A neutral module: it imports nothing from the programs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# The loggers the OTLP/HTTP span exporter writes its per-attempt records to (the package's, and its shared HTTP
# client's when it is given none).
EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http",
    "opentelemetry.exporter.otlp.common.http",
)

log = logging.getLogger(__name__)


class _HeldBack(logging.Filter):
    """Drops the records logged in a thread while that thread is inside `holding`, keeping their messages."""

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        held: list[str] | None = getattr(self._local, "messages", None)
        if held is None:
            return True
        held.append(record.getMessage())
        return False

    @contextmanager
    def holding(self) -> Iterator[list[str]]:
        self._local.messages = messages = []
        try:
            yield messages
        finally:
            self._local.messages = None


_HELD_BACK = _HeldBack()
_installed = threading.Lock()


@contextmanager
def held_back_exporter_logs() -> Iterator[list[str]]:
    """Within the block, the exporter's records logged by this thread are not written; the list yielded holds their
    messages (oldest first) once the block ends."""
    with _installed:
        for name in EXPORTER_LOGGERS:
            exporter_log = logging.getLogger(name)
            if _HELD_BACK not in exporter_log.filters:
                exporter_log.addFilter(_HELD_BACK)
    with _HELD_BACK.holding() as messages:
        yield messages


class ExportFailureLog:
    """The log lines of one span export (to `traces_url`): a warning on the first failure after success (or after
    the start), an info line on the first success after failures, with the exports and spans failed meanwhile.
    `failed` and `succeeded` may be called from any thread."""

    def __init__(self, traces_url: str) -> None:
        self._traces_url = traces_url
        self._lock = threading.Lock()
        self.failing = False
        self.failed_exports = 0  # since exports started failing (0 while they succeed)
        self.failed_spans = 0

    def failed(self, spans: int, reason: str) -> None:
        """One export of `spans` spans failed, for `reason` (one line)."""
        with self._lock:
            first = not self.failing
            self.failing = True
            self.failed_exports += 1
            self.failed_spans += spans
        if first:
            log.warning(
                "span export to %s is failing (%s); until an export succeeds, failures are only counted in /metrics "
                "(*_trace_spans_total{outcome=\"failed\"})",
                self._traces_url,
                reason,
            )

    def succeeded(self) -> None:
        """One export succeeded."""
        with self._lock:
            recovered = self.failing
            exports, spans = self.failed_exports, self.failed_spans
            self.failing = False
            self.failed_exports = self.failed_spans = 0
        if recovered:
            log.info(
                "span export to %s recovered after %d failed export%s (%d span%s not exported)",
                self._traces_url,
                exports,
                "" if exports == 1 else "s",
                spans,
                "" if spans == 1 else "s",
            )
