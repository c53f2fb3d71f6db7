"""Prometheus figures per replica: requests, predicted and actual cached tokens (counted per finished record), and
load, health, index sizes, resyncs and failovers (read from the replica sets at scrape time)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from db.records import RequestRecord


class ReplicaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("upstream", "replica")
        self.requests = Counter(
            "prefixscope_gateway_replica_requests", "Requests served per replica.", labels, registry=registry
        )
        self.predicted_tokens = Counter(
            "prefixscope_gateway_replica_predicted_cached_tokens",
            "Prompt tokens the router predicted the replica had cached (cache_aware routing).",
            labels,
            registry=registry,
        )
        self.cached_tokens = Counter(
            "prefixscope_gateway_replica_cached_tokens",
            "Prompt tokens the replica reported it served from cache.",
            labels,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "prefixscope_gateway_replica_prompt_tokens", "Prompt tokens per replica.", labels, registry=registry
        )
        self._registry = registry
        self._children: dict[tuple[str, str], tuple[Any, ...]] = {}

    def observe(self, record: RequestRecord) -> None:
        if record.replica is None:
            return
        labels = (record.upstream, record.replica)
        children = self._children.get(labels)
        if children is None:
            # labels() is comparatively slow: looked up once per replica. The predicted counter is served from the
            # replica's first request on, even at 0.
            children = self._children[labels] = tuple(
                metric.labels(*labels)
                for metric in (self.requests, self.predicted_tokens, self.cached_tokens, self.prompt_tokens)
            )
        requests, predicted, cached, prompt = children
        requests.inc()
        # Only where the engine reported what matched, as the dashboard's router accuracy counts, so that predicted
        # and actual cached tokens compare: a refused request's prediction has nothing to be compared with.
        if record.predicted_match_tokens and record.cached_tokens is not None and record.status_code < 400:
            predicted.inc(record.predicted_match_tokens)
        if record.cached_tokens:
            cached.inc(record.cached_tokens)
        if record.prompt_tokens:
            prompt.inc(record.prompt_tokens)

    def watch(self, replica_sets: Callable[[], Iterable[Any]]) -> None:
        self._registry.register(_ReplicaStateCollector(replica_sets))


class _ReplicaStateCollector(Collector):
    def __init__(self, replica_sets: Callable[[], Iterable[Any]]) -> None:
        self._replica_sets = replica_sets

    def collect(self) -> Iterator[Any]:
        labels = ["upstream", "replica"]
        load = GaugeMetricFamily("prefixscope_gateway_replica_load", "Requests in flight per replica.", labels=labels)
        healthy = GaugeMetricFamily(
            "prefixscope_gateway_replica_healthy", "1 while the replica is in rotation.", labels=labels
        )
        synced = GaugeMetricFamily(
            "prefixscope_gateway_replica_events_synced",
            "1 while the router follows the replica's KV events (its events index is current).",
            labels=labels,
        )
        blocks = GaugeMetricFamily(
            "prefixscope_gateway_replica_indexed_blocks", "Blocks in the router's index per replica.",
            labels=[*labels, "index"],
        )
        taken_out = CounterMetricFamily(
            "prefixscope_gateway_replica_taken_out", "Times the replica was taken out of rotation.", labels=labels
        )
        resyncs = CounterMetricFamily(
            "prefixscope_gateway_replica_event_replays", "KV-event replays completed (start, gaps, restarts).",
            labels=labels,
        )
        gaps = CounterMetricFamily(
            "prefixscope_gateway_replica_event_gaps", "KV-event sequence gaps and engine restarts detected.",
            labels=labels,
        )
        failovers = CounterMetricFamily(
            "prefixscope_gateway_failovers", "Requests retried on another replica.", labels=["upstream"]
        )
        for replica_set in self._replica_sets():
            failovers.add_metric([replica_set.name], float(replica_set.failovers))
            for replica in replica_set.replicas:
                key = [replica_set.name, replica.url]
                load.add_metric(key, float(replica.load))
                healthy.add_metric(key, 1.0 if replica.healthy else 0.0)
                synced.add_metric(key, 1.0 if replica.events_synced else 0.0)
                blocks.add_metric([*key, "events"], float(replica.index.num_blocks()))
                blocks.add_metric([*key, "approximate"], float(replica.approximate.num_blocks()))
                taken_out.add_metric(key, float(replica.taken_out))
                subscriber = replica.subscriber
                resyncs.add_metric(key, float(subscriber.replays if subscriber else 0))
                gaps.add_metric(key, float(subscriber.gaps + subscriber.restarts if subscriber else 0))
        yield from (load, healthy, synced, blocks, taken_out, resyncs, gaps, failovers)
