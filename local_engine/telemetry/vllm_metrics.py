"""The Prometheus series that vLLM's Grafana boards and alerts read, served by the engine under vLLM's names.

Names, types, label names (`model_name`, `engine`) and meaning follow vLLM's V1 `PrometheusStatLogger`
(`vllm/v1/metrics/loggers.py`), whose series its example board (`examples/observability/prometheus_grafana/
grafana.json`, "Monitoring vLLM Inference Server") plots; histogram buckets are vLLM's, so quantiles computed over
a fleet mixing both engines agree. `model_name` is the served model id (`/v1/models`), `engine` is "0" (one engine
core per process).

| series | type | meaning here |
|---|---|---|
| `vllm:prefix_cache_queries` | counter | prompt tokens looked up in the prefix cache (once per request, at admission) |
| `vllm:prefix_cache_hits` | counter | of those, tokens served from cache (any tier) |
| `vllm:prompt_tokens` | counter | prompt tokens of admitted requests |
| `vllm:prompt_tokens_by_source{source}` | counter | `local_compute` (prefilled), `local_cache_hit`, |
| | | `external_kv_transfer` (always 0) |
| `vllm:prompt_tokens_cached` | counter | prompt tokens served from cache (local + external) |
| `vllm:generation_tokens` | counter | tokens generated |
| `vllm:num_preemptions` | counter | running requests preempted (recompute) |
| `vllm:request_success{finished_reason}` | counter | finished requests by `stop`, `length`, `abort` |
| `vllm:num_requests_running` / `_waiting` | gauge | requests in the running batch / queued |
| `vllm:kv_cache_usage_perc` | gauge | share (0-1) of KV slots held by requests; cached slots no request holds |
| | | count as free, as vLLM's evictable blocks do |
| `vllm:time_to_first_token_seconds` | histogram | arrival at the engine to the first token |
| `vllm:inter_token_latency_seconds` | histogram | time between consecutive output tokens of a request |
| `vllm:request_time_per_output_token_seconds` | histogram | a request's decode time / (output tokens - 1) |
| `vllm:e2e_request_latency_seconds` | histogram | arrival to finish |
| `vllm:request_queue_time_seconds` | histogram | arrival to admission (WAITING) |
| `vllm:request_prefill_time_seconds` | histogram | admission to first token (PREFILL) |
| `vllm:request_decode_time_seconds` | histogram | first token to finish (DECODE) |
| `vllm:request_inference_time_seconds` | histogram | admission to finish (RUNNING) |

The histograms are observed by the engine's worker thread (`ServingHistograms`, held by `EngineCounters`); the
counters and gauges are read from the engine's own counters and cache statistics at scrape time.
"""

from __future__ import annotations

from collections import Counter as TallyCounter
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

LABEL_NAMES = ("model_name", "engine")
ENGINE_INDEX = "0"
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
# The engine's finish reasons as vLLM names them (`vllm.v1.engine.FinishReason`).
FINISHED_REASONS = {"stop": "stop", "length": "length", "cancelled": "abort"}

# vLLM's buckets (seconds).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                  40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                           20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                             240.0, 480.0, 960.0, 1920.0, 7680.0)


def _histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
    # Unregistered and unlabelled: the scrape adds `model_name` and `engine`, which the worker need not know.
    return Histogram(name, documentation, registry=None, buckets=buckets)


class ServingHistograms:
    """Per-request latency histograms, observed by the engine's worker thread (seconds), and finishes by reason."""

    def __init__(self) -> None:
        self.ttft = _histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                               TTFT_BUCKETS_S)
        self.inter_token = _histogram("vllm:inter_token_latency_seconds",
                                      "Histogram of inter-token latency in seconds.", TOKEN_LATENCY_BUCKETS_S)
        self.time_per_output_token = _histogram("vllm:request_time_per_output_token_seconds",
                                                "Histogram of time_per_output_token_seconds per request.",
                                                TOKEN_LATENCY_BUCKETS_S)
        self.e2e = _histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                              REQUEST_LATENCY_BUCKETS_S)
        self.queue = _histogram("vllm:request_queue_time_seconds",
                                "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS_S)
        self.prefill = _histogram("vllm:request_prefill_time_seconds",
                                  "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS_S)
        self.decode = _histogram("vllm:request_decode_time_seconds",
                                 "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS_S)
        self.inference = _histogram("vllm:request_inference_time_seconds",
                                    "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS_S)
        self.finished_by_reason: TallyCounter[str] = TallyCounter()

    def observe_finish(self, reason: str, queued_s: float, prefill_s: float, ttft_s: float, decode_s: float,
                       num_generated: int) -> None:
        """One finished request: its phases in seconds (`ttft_s` 0 when no token came) and its output tokens."""
        self.finished_by_reason[FINISHED_REASONS.get(reason, reason)] += 1
        self.queue.observe(queued_s)
        if ttft_s > 0:
            self.ttft.observe(ttft_s)
            self.prefill.observe(prefill_s)
            self.decode.observe(decode_s)
            self.inference.observe(prefill_s + decode_s)
            self.e2e.observe(ttft_s + decode_s)
        else:
            self.e2e.observe(queued_s)
        if num_generated > 1:
            self.time_per_output_token.observe(decode_s / (num_generated - 1))

    def all(self) -> tuple[Histogram, ...]:
        return (self.ttft, self.inter_token, self.time_per_output_token, self.e2e, self.queue, self.prefill,
                self.decode, self.inference)


def vllm_families(model_name: str, counters: Any, stats: Mapping[str, Any]) -> Iterator[Metric]:
    """The vLLM-named families for one scrape: `counters` is the engine's `EngineCounters`, `stats` its
    `cache_stats()` (capacity, free, evictable, running and waiting figures)."""
    labels = {"model_name": model_name, "engine": ENGINE_INDEX}
    values = list(labels.values())

    def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, documentation, labels=LABEL_NAMES)
        family.add_metric(values, value)
        return family

    def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, documentation, labels=LABEL_NAMES)
        family.add_metric(values, value)
        return family

    prompt, cached = counters.prompt_tokens, counters.cached_tokens
    yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", prompt)
    yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", cached)
    yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", prompt)
    by_source = CounterMetricFamily("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                    labels=[*LABEL_NAMES, "source"])
    for source, value in zip(PROMPT_SOURCES, (prompt - cached, cached, 0), strict=True):
        by_source.add_metric([*values, source], value)
    yield by_source
    yield counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", cached)
    yield counter("vllm:generation_tokens", "Number of generation tokens processed.", counters.completion_tokens)
    yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", counters.preemptions)
    success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                  labels=[*LABEL_NAMES, "finished_reason"])
    finished = counters.serving.finished_by_reason
    for reason in ("stop", "length", "abort"):
        success.add_metric([*values, reason], finished.get(reason, 0))
    yield success
    yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                stats["active_requests"])
    yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats["waiting_requests"])
    capacity = stats["capacity_tokens"]
    held = capacity - stats["free_tokens"] - stats["evictable_tokens"]
    yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                held / capacity if capacity else 0.0)
    for histogram in counters.serving.all():
        for metric in histogram.collect():
            yield _with_labels(metric, labels)


def _with_labels(metric: Metric, labels: dict[str, str]) -> Metric:
    labelled = Metric(metric.name, metric.documentation, metric.type, metric.unit)
    labelled.samples = [sample._replace(labels={**labels, **sample.labels}) for sample in metric.samples]
    return labelled
