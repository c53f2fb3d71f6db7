"""Prometheus series of the KV-event publisher (from the `kv_events` object of `GET /v1/cache`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_COUNTERS = (
    ("prefixscope_engine_kv_event_batches", "KV-event batches published.", "batches_total"),
    ("prefixscope_engine_kv_events", "KV events published.", "events_total"),
    ("prefixscope_engine_kv_events_lost", "KV events lost to a full publisher queue (then re-announced).",
     "lost_events_total"),
    ("prefixscope_engine_kv_event_reannouncements", "Batches that re-announced the whole cache state.",
     "reannouncements_total"),
    ("prefixscope_engine_kv_event_replay_requests", "Replay requests answered.", "replay_requests_total"),
)


def kv_event_metrics(figures: Mapping[str, Any] | None) -> Iterator[Any]:
    """Nothing when the engine publishes no events (no prefix cache)."""
    if not figures:
        return
    for name, documentation, key in _COUNTERS:
        yield CounterMetricFamily(name, documentation, value=figures[key])
    yield GaugeMetricFamily("prefixscope_engine_kv_event_held_blocks", "Blocks announced as held in some tier.",
                            value=figures["held_blocks"])
