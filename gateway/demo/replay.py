"""Demo requests through the gateway's own code: normalization pipeline, salts, `RequestTracker`, explainer (with its
conversation tracker: multi-turn chats link into conversations with their token ledgers), uplift.

Each request is built by `gateway.demo.traffic`, normalized by the tenant's `Pipeline`, salted and handed to the
tenant's upstream, which here is a `SimulatedEngine` answering in that upstream kind's response shape (read back by
the gateway's own adapter). The tracker then builds the record exactly as the proxy's does, with the explainer's
reason, divergence, hash chain and (for a sample, on the local engine) the normalization gain from a dry-run match of
the raw request. Only the clock is the demo's: records get the demo's times and latencies.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from db.held_record import HeldRecord
from db.records import RequestRecord
from gateway.config import GatewayConfig
from gateway.conversations.tracker import ConversationTracker
from gateway.demo.engine_model import SimulatedEngine, local_engine_response, openai_response, render
from gateway.demo.traffic import TENANTS, TenantProfile, Traffic
from gateway.errors import UpstreamTimeout, UpstreamUnavailable
from gateway.explain.explainer import ExplainContext, Explainer
from gateway.explain.segments import chat_segments, completion_segments
from gateway.explain.uplift import UpliftJob, uplift_gain
from gateway.fingerprint import prefix_hash, prompt_text
from gateway.normalize.pipeline import Pipeline, build_pipeline
from gateway.parsing import CHAT
from gateway.record_keys import RecordHasher
from gateway.recording import Recorder, RequestTracker
from gateway.request_stages import Admitted, Answered, Outcome, Parsed, Prepared, Routed
from gateway.tenancy import SaltDeriver
from gateway.upstreams.base import UpstreamAdapter
from gateway.upstreams.kinds import LocalEngineAdapter, OpenAICompatibleAdapter, SGLangAdapter, VLLMAdapter

# The local engine's served model id (`prefixscope engine`'s default) and the gateway's default upstream name for it.
LOCAL_MODEL = "smollm2"
LOCAL_UPSTREAM = GatewayConfig.default_upstream
# Which upstreams serve each model, their kind, and the cache each has: (device pages of 16 tokens, seconds idle to
# expire).
UPSTREAMS: dict[str, tuple[str, ...]] = {
    LOCAL_MODEL: (LOCAL_UPSTREAM,),
    "llama-3.1-8b-instruct": ("vllm-a", "vllm-b"),
    "qwen2.5-7b-instruct": ("sglang-a",),
    "gpt-4o-mini": ("hosted-openai",),
}
UPSTREAM_KINDS: dict[str, tuple[UpstreamAdapter, int, float]] = {
    LOCAL_UPSTREAM: (LocalEngineAdapter(), 1_500, 900.0),
    "vllm-a": (VLLMAdapter(), 8_000, 3_600.0),
    "vllm-b": (VLLMAdapter(), 8_000, 3_600.0),
    "sglang-a": (SGLangAdapter(), 3_000, 3_600.0),
    "hosted-openai": (OpenAICompatibleAdapter(), 4_000, 300.0),
}
# Host tier pages (of 16 tokens) behind the device pages, taking the pages the device evicts; only the local engine
# reports its tiers, so only it has one. The local engine's 1,500 + 8,500 pages hold what one LRU cache of 10,000
# pages would (the host tier drops its pages in the order the device demoted them), so its hits and misses are those
# of a single 10,000-page cache; about a fifth of its hit tokens come from the host tier.
HOST_TIER_PAGES: dict[str, int] = {LOCAL_UPSTREAM: 8_500}
# Upstream failures as the gateway records them: its own errors, and upstream errors relayed without a typed body.
_ERRORS = (
    (UpstreamUnavailable.status_code, UpstreamUnavailable.error_type),
    (UpstreamTimeout.status_code, UpstreamTimeout.error_type),
    (500, "upstream_error"),
    (429, "upstream_error"),
)
_ERROR_RATE = 0.015
# Seconds of engine time between two requests (one pool of requests is one busy stretch of traffic).
_SECONDS_PER_REQUEST = 2.0


def demo_secret(seed: int) -> str:
    """The server secret the demo's salts and record keys derive from."""
    return f"prefixscope-demo-{seed}"


@dataclass(frozen=True, slots=True)
class _Route:
    """What the explainer reads of a route: its name, adapter, and where a dry-run match goes."""

    name: str
    adapter: UpstreamAdapter
    match_url: str
    headers: dict[str, str]


class _Sink:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def submit(self, record: RequestRecord) -> bool:
        self.records.append(record)
        return True

    def hold(self, record: RequestRecord) -> HeldRecord:
        return HeldRecord(record.request_id, self.submit)

    def counters(self) -> Any:
        return None


class _NoMetrics:
    def observe(self, record: RequestRecord) -> None:
        pass


class _DryRunUplift:
    """The uplift checker's `defer`, answered at once by a dry-run match of the raw request on the simulated engine."""

    def __init__(self, replay: Replay) -> None:
        self._replay = replay

    def defer(self, record: RequestRecord, job: UpliftJob, submit: Callable[[RequestRecord], None]) -> bool:
        body = {**job.raw_body, "model": record.model}
        matched = self._replay.dry_run(job.match_url, job.endpoint, body, job.salt)
        submit(replace(record, normalization_gain_tokens=uplift_gain(job, matched)))
        return True


class Replay:
    """Sends demo requests through the gateway's request path into simulated engines; `sink.records` collects them."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(f"replay/{seed}")
        self.traffic = Traffic(seed)
        self.sink = _Sink()
        uplift: Any = _DryRunUplift(self)
        self.secret = secret = demo_secret(seed)
        metrics: Any = _NoMetrics()
        self.recorder = Recorder(self.sink, metrics, RecordHasher(secret))
        self.now = 0.0  # the request's time (POSIX seconds): the conversation tracker's clock
        conversations = ConversationTracker(self.recorder.hash_key, clock=lambda: self.now)
        self.explainer = Explainer(uplift, rng=random.Random(f"uplift/{seed}"), conversations=conversations)
        self.recorder.compose(explainer=self.explainer, uplift=uplift)
        self.salts = SaltDeriver(secret)
        self.pipelines: dict[str, Pipeline] = {
            profile.name: build_pipeline(profile.settings, conversations.returned.lookup_for(profile.name))
            for profile in TENANTS
        }
        self.engines = {
            name: SimulatedEngine(pages, ttl, HOST_TIER_PAGES.get(name, 0))
            for name, (_, pages, ttl) in UPSTREAM_KINDS.items()
        }
        self.routes = {name: _Route(name, adapter, name, {}) for name, (adapter, _, _) in UPSTREAM_KINDS.items()}
        self.clock = 0.0
        self.latencies: dict[str, float] = {}

    def _rendered(self, upstream: str, endpoint: str, body: dict[str, Any], salt: str) -> Any:
        segments = (chat_segments if endpoint == CHAT else completion_segments)(body)
        return render(f"{upstream}/{body.get('model')}/{salt}", segments)

    def dry_run(self, upstream: str, endpoint: str, body: dict[str, Any], salt: str) -> int:
        """Tokens the engine would match of `body` now, caching nothing (`POST /v1/cache/match`)."""
        return self.engines[upstream].match(self._rendered(upstream, endpoint, body, salt), self.clock).matched_tokens

    def send(self, profile: TenantProfile, request_id: str, created_at: datetime) -> None:
        """The next request of `profile`'s tenant (model, upstream, streaming and failures drawn at random)."""
        rng = self.rng
        model = rng.choice(profile.models)
        upstream = rng.choice(UPSTREAMS[model])
        raw = dict(self.traffic.request(profile, model, created_at))
        stream = rng.random() < profile.stream_rate
        if stream:
            raw["stream"] = True
        error = rng.choice(_ERRORS) if rng.random() < _ERROR_RATE else None
        self.handle(profile, raw, upstream, request_id, created_at, error)

    def handle(
        self,
        profile: TenantProfile,
        raw: dict[str, Any],
        upstream: str,
        request_id: str,
        created_at: datetime,
        error: tuple[int, str] | None = None,
    ) -> None:
        """Record one request `raw` of `profile`'s tenant sent to `upstream` (failing with `error`: status, type), as
        the proxy does; the record goes to `sink`, its latency to `latencies`."""
        rng = self.rng
        self.clock += _SECONDS_PER_REQUEST
        self.now = created_at.timestamp()
        route = self.routes[upstream]
        endpoint = CHAT if profile.endpoint == "chat.completions" else profile.endpoint
        model, stream = str(raw["model"]), raw.get("stream") is True
        tracker = RequestTracker(self.recorder, request_id, endpoint, time.perf_counter(), created_at=created_at)
        tracker.admitted(Admitted(profile.name, self.salts.salt_for(profile.name)[:10] + f"{rng.randrange(2):02d}"))
        tracker.parsed(Parsed(model, stream))
        tracker.routed(Routed(upstream))
        normalized = self.pipelines[profile.name].apply(raw)
        settings = profile.settings
        salt = self.salts.salt_for(profile.name)
        sent = route.adapter.apply_salt(normalized.request, salt)
        if settings.hash_chain:
            route.adapter.ask_for_hash_chain(sent, settings.hash_block_size)
        demo_route: Any = route
        context = ExplainContext(settings, endpoint, profile.name, normalized.request, raw, salt, demo_route, False)
        tracker.prepared(
            Prepared(
                applied_rules=normalized.applied_rules,
                prefix_hash=prefix_hash(endpoint, normalized.request, self.recorder.hash_key(profile.name)),
                prompt_text=prompt_text(endpoint, normalized.request) if settings.store_prompt_text else None,
                namespace_label=self.salts.label_for(profile.name) if route.adapter.salt_field is not None else None,
                explain=context,
            )
        )
        self.explainer.prepare(context)
        if error is not None:
            status, error_type = error
            context.upstream_status = status if error_type == "upstream_error" else None
            self.latencies[request_id] = rng.uniform(5, 30_000)
            tracker.finish(status, error_type)
            return
        namespace_salt = salt if route.adapter.salt_field is not None else ""
        match = self.engines[upstream].serve(self._rendered(upstream, endpoint, normalized.request, namespace_salt),
                                             self.clock)
        completion_tokens = rng.randint(5, 400)
        # Prefill dominates TTFT and is roughly linear in uncached tokens; log-normal noise for queueing. Loading the
        # host tier's pages back comes before the prefill, inside the engine's TTFT.
        ttft_ms = (12.0 + 0.09 * (match.prompt_tokens - match.matched_tokens)) * rng.lognormvariate(0.0, 0.25)
        ttft_ms += match.load_ms
        self.latencies[request_id] = ttft_ms + completion_tokens * rng.uniform(6.0, 14.0)
        adapter = route.adapter
        cache_report = None
        if isinstance(adapter, LocalEngineAdapter):
            with_chain = sent.get("return_hash_chain") is True
            headers, body = local_engine_response(match, completion_tokens, ttft_ms, with_chain)
            cache_report = adapter.cache_report(headers)
            context.prefix_cache = body["prefix_cache"]
        else:
            body = openai_response(match, completion_tokens, reports_cached=upstream != "hosted-openai")
        context.upstream_status = 200
        tracker.answered(
            Answered(
                Outcome(200),
                usage=adapter.usage(body),
                cache_report=cache_report,
                ttft_ms=ttft_ms if stream else None,  # streams: the gateway's clock (first content byte)
            )
        )
        tracker.finish(200)

    def take(self) -> list[RequestRecord]:
        """The records so far (with the demo's latencies), in the order they were sent; clears the sink."""
        records = [replace(record, latency_ms=self.latencies.pop(record.request_id)) for record in self.sink.records]
        self.sink.records = []
        return records
