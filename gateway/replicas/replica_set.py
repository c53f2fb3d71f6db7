"""A replica set: several engines behind one upstream name, and the choice of one of them for each request.

`place` predicts, for every healthy replica, how many of the request's prompt tokens it holds and lets the policy
(`gateway.replicas.policy`) choose. The prediction comes from the replica's KV events (`events`: the gateway
tokenizes the prompt with the replica's tokenizer and looks its blocks up in `EventIndex`, weighing each block by the
fastest tier holding it) while they are followed, else from what the gateway itself sent there (`approximate`).
Where the events come from: each replica's configured `kv_events` endpoints, or for prefixscope's engine the
endpoints it advertises in `GET /v1/cache` (with the tokenizer from `GET /v1/tokenizer`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from gateway.config import UpstreamConfig
from gateway.config.router import ReplicaEvents
from gateway.errors import UpstreamUnavailable
from gateway.replicas.approximate_index import ApproximateIndex
from gateway.replicas.event_index import EventIndex, block_keys
from gateway.replicas.event_subscriber import EventSubscriber
from gateway.replicas.health import health_loop
from gateway.replicas.policy import Candidate, choose
from gateway.replicas.request_tokens import RequestTokenizer, TokenizerUnavailable
from gateway.replicas.text_chain import TextChain, prompt_material, text_chain
from gateway.upstreams.route import Route, build_route

log = logging.getLogger(__name__)

SCORE_BLOCK_TOKENS = 16  # the unit of `matched blocks` in the score, whatever index the prediction came from
_DEFAULT_TOKENS_PER_CHAR = 0.25
_TOKENIZE_IN_THREAD_CHARS = 16_000  # longer prompts are tokenized off the event loop
_DISCOVERY_RETRY_S = 5.0


class Replica:
    """One engine of a set: its route, health, in-flight load and the two indexes of what it caches."""

    def __init__(self, upstream: UpstreamConfig, url: str, position: int, events: ReplicaEvents | None) -> None:
        self.url = url
        self.position = position
        self.route: Route = build_route(replace(upstream, url=url, replicas=(), replica_events=()))
        root = self.route.upstream.server_root
        self.health_url = f"{root}/health"
        self.cache_url = f"{root}/v1/cache"
        self.tokenizer_url = f"{root}/v1/tokenizer"
        self.auth_headers = {"authorization": f"Bearer {upstream.api_key}"} if upstream.api_key else {}
        settings = upstream.router
        self.index = EventIndex()
        self.events_config = events
        self.subscriber: EventSubscriber | None = None
        self.approximate = ApproximateIndex(
            max(1, int(settings.approx_capacity_tokens / _DEFAULT_TOKENS_PER_CHAR) // settings.approx_block_chars),
            settings.approx_ttl_s,
        )
        self.healthy = True
        self.load = 0
        self.taken_out = 0

    @property
    def events_synced(self) -> bool:
        """Whether this replica's KV events are followed and current (else its predictions are approximate)."""
        return self.healthy and self.subscriber is not None and self.subscriber.synced

    def mark_unhealthy(self) -> None:
        if self.healthy:
            self.taken_out += 1
        self.healthy = False
        if self.subscriber is not None:
            self.subscriber.unsync()

    def mark_healthy(self) -> None:
        self.healthy = True
        self.approximate.clear()
        if self.subscriber is not None:
            self.subscriber.rebuild()  # possibly a new process: learn its cache from a replay


@dataclass(slots=True)
class Placement:
    """Where one request goes and what the router predicted there."""

    route: Route
    replica: Replica | None = None
    policy: str | None = None
    reason: str | None = None
    predicted_match_tokens: int | None = None
    index_source: str | None = None
    text: TextChain | None = None
    excluded: list[str] = field(default_factory=list)
    deferred_text: tuple[str, dict[str, Any], str, str] | None = None  # (endpoint, body, namespace, model)
    best_other_match_tokens: int | None = None  # the most cached tokens predicted on another candidate


@dataclass(frozen=True, slots=True)
class _Prediction:
    tokens: int  # predicted cached tokens
    source: str  # events | approximate
    score_blocks: float  # matched blocks of SCORE_BLOCK_TOKENS, weighted by tier


class ReplicaSet:
    def __init__(self, upstream: UpstreamConfig) -> None:
        self.upstream = upstream
        self.policy = upstream.routing
        self.settings = upstream.router
        events = upstream.replica_events
        self.replicas = [
            Replica(upstream, url, i, events[i] if i < len(events) else None) for i, url in enumerate(upstream.replicas)
        ]
        self.tokenizer: RequestTokenizer | None = None
        self.tokens_per_char = _DEFAULT_TOKENS_PER_CHAR
        self.failovers = 0
        self._turn = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._client: httpx.AsyncClient | None = None

    @property
    def name(self) -> str:
        return self.upstream.name

    @property
    def follows_events(self) -> bool:
        return self.settings.events and self.policy == "cache_aware"

    async def start(self) -> None:
        settings = self.settings
        self._client = httpx.AsyncClient(timeout=settings.health_timeout_s, trust_env=False)
        for replica in self.replicas:
            self._tasks.append(asyncio.create_task(health_loop(self._client, replica, settings.health_interval_s)))
        if self.follows_events:
            self._tasks.append(asyncio.create_task(self._load_tokenizer()))
            for replica in self.replicas:
                self._tasks.append(asyncio.create_task(self._follow(replica)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._client is not None:
            await self._client.aclose()

    # ---- following events ---------------------------------------------------------------------------------------

    async def _load_tokenizer(self) -> None:
        """The configured tokenizer, else (prefixscope's engine) the one a replica serves; retried until one loads."""
        style = "local_engine" if self.upstream.kind == "local_engine" else "template"
        if self.settings.tokenizer:
            try:
                self.tokenizer = await asyncio.to_thread(RequestTokenizer.from_path, self.settings.tokenizer, style)
            except TokenizerUnavailable as error:
                log.error("upstream %s: %s; routing by the approximate index", self.name, error)
            return
        if self.upstream.kind != "local_engine":
            log.warning("upstream %s: no [router] tokenizer: its KV events cannot be matched", self.name)
            return
        assert self._client is not None
        while self.tokenizer is None:
            for replica in self.replicas:
                try:
                    response = await self._client.get(replica.tokenizer_url, headers=replica.auth_headers, timeout=30)
                    if response.status_code == 200:
                        self.tokenizer = await asyncio.to_thread(RequestTokenizer.from_engine, response.json())
                        return
                except (httpx.HTTPError, ValueError, TokenizerUnavailable) as error:
                    log.debug("tokenizer of %s: %s", replica.url, error)
            await asyncio.sleep(_DISCOVERY_RETRY_S)

    async def _follow(self, replica: Replica) -> None:
        events = replica.events_config
        while events is None and self.upstream.kind == "local_engine":
            events = await self._advertised_events(replica)
            if events is None:
                await asyncio.sleep(_DISCOVERY_RETRY_S)
        if events is None:
            return
        replica.subscriber = EventSubscriber(replica.index, events, self.settings.replay_timeout_s)
        await replica.subscriber.run()

    async def _advertised_events(self, replica: Replica) -> ReplicaEvents | None:
        """Where prefixscope's engine publishes (`kv_events` in `GET /v1/cache`), its wildcard host replaced by the
        replica's."""
        assert self._client is not None
        try:
            response = await self._client.get(replica.cache_url, headers=replica.auth_headers)
            advertised = response.json().get("kv_events") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        if not isinstance(advertised, dict) or not advertised.get("endpoint"):
            return None
        host = urlsplit(replica.url).hostname or "127.0.0.1"
        replay = advertised.get("replay_endpoint")
        return ReplicaEvents(_reachable(advertised["endpoint"], host), replay and _reachable(replay, host),
                             str(advertised.get("topic") or ""))

    # ---- placement ----------------------------------------------------------------------------------------------

    async def place(
        self, client: httpx.AsyncClient, endpoint: str, body: dict[str, Any], namespace: str, model: str,
        excluded: Sequence[str] = (),
    ) -> Placement:
        """Choose a replica for `body` (the final upstream request, salt applied) and count it as loaded. Raises
        `UpstreamUnavailable` when every replica was excluded."""
        tokens = None
        tokenizer = self.tokenizer
        if self.policy == "cache_aware" and tokenizer is not None and any(r.events_synced for r in self.replicas):
            if len(str(body.get("messages") or body.get("prompt") or "")) > _TOKENIZE_IN_THREAD_CHARS:
                tokens = await asyncio.to_thread(tokenizer.prompt_token_ids, endpoint, body)
            else:
                tokens = tokenizer.prompt_token_ids(endpoint, body)
        return self.decide(endpoint, body, namespace, model, tokens, excluded)

    def decide(
        self, endpoint: str, body: dict[str, Any], namespace: str, model: str, tokens: list[int] | None,
        excluded: Sequence[str] = (), now: float | None = None,
    ) -> Placement:
        """`place` once the prompt is tokenized (`tokens`: None when it could not be): the routing decision itself."""
        allowed = [r for r in self.replicas if r.url not in excluded]
        if not allowed:
            raise UpstreamUnavailable(f"every replica of {self.name!r} failed this request")
        candidates = [r for r in allowed if r.healthy] or allowed
        self._turn += 1
        now = time.monotonic() if now is None else now
        # The text chain feeds the approximate index; when every candidate is predicted from its events, it is
        # built after the request (`release`), off the decision's path.
        deferred = self.policy == "cache_aware" and tokens is not None and all(r.events_synced for r in candidates)
        text = None if deferred else self._text_chain(endpoint, body, namespace, model)
        if self.policy != "cache_aware":
            pool = [Candidate(r.position, r.load) for r in candidates]
            chosen = choose(self.policy, pool, self.settings, self._turn, 0)
            return self._placed(chosen.position, chosen.reason, None, text, namespace, {}, now, excluded)
        keys: dict[int, list[int]] = {}  # block size -> the prompt's router keys
        prompt_tokens = len(tokens) if tokens else round(text.num_chars * self.tokens_per_char)
        predictions = {r.position: self._predict(r, namespace, text, tokens, keys, prompt_tokens, now)
                       for r in candidates}
        pool = [
            Candidate(r.position, r.load, predictions[r.position].score_blocks, predictions[r.position].tokens,
                      r.index.num_blocks() + r.approximate.num_blocks())
            for r in candidates
        ]
        chosen = choose(self.policy, pool, self.settings, self._turn, prompt_tokens)
        placement = self._placed(chosen.position, chosen.reason, predictions[chosen.position], text, namespace, keys,
                                 now, excluded)
        if deferred:
            placement.deferred_text = (endpoint, body, namespace, model)
        others = [p.tokens for position, p in predictions.items() if position != chosen.position]
        placement.best_other_match_tokens = max(others, default=None)
        return placement

    def _text_chain(self, endpoint: str, body: dict[str, Any], namespace: str, model: str) -> TextChain:
        return text_chain(namespace, model, prompt_material(endpoint, body), self.settings.approx_block_chars)

    def _predict(
        self, replica: Replica, namespace: str, text: TextChain | None, tokens: list[int] | None,
        keys: dict[int, list[int]], prompt_tokens: int, now: float,
    ) -> _Prediction:
        """Cached tokens predicted on one replica (at most all but the last prompt token), and where from."""
        limit = max(0, prompt_tokens - 1)
        size = replica.index.block_size
        if tokens is not None and replica.events_synced:
            if size is None:
                return _Prediction(0, "events", 0.0)  # nothing announced yet
            if size not in keys:
                keys[size] = block_keys(namespace, tokens, size)
            blocks, weighted = replica.index.match(keys[size], now)
            return _Prediction(min(limit, blocks * size), "events", weighted * size / SCORE_BLOCK_TOKENS)
        assert text is not None  # built whenever some candidate is predicted approximately
        blocks = replica.approximate.match_blocks(namespace, text.hashes, now)
        predicted = min(limit, round(blocks * text.block_chars * self.tokens_per_char))
        return _Prediction(predicted, "approximate", predicted // SCORE_BLOCK_TOKENS)

    def _placed(
        self, position: int, reason: str, prediction: _Prediction | None, text: TextChain | None, namespace: str,
        keys: dict[int, list[int]], now: float, excluded: Sequence[str],
    ) -> Placement:
        replica = self.replicas[position]
        replica.load += 1
        if text is not None:
            replica.approximate.record(namespace, text.hashes, now)
        size = replica.index.block_size
        if size in keys:
            replica.index.expect(keys[size], now + self.settings.pending_ttl_s)
        predicted = None if prediction is None else prediction.tokens
        source = None if prediction is None else prediction.source
        return Placement(replica.route, replica, self.policy, reason, predicted, source, text, list(excluded))

    # ---- outcome ------------------------------------------------------------------------------------------------

    def release(self, placement: Placement, prompt_tokens: int | None) -> None:
        """The request is done with its replica; learn the characters-per-token ratio from its usage."""
        if placement.replica is None:
            return
        placement.replica.load -= 1
        if placement.deferred_text is not None:
            endpoint, body, namespace, model = placement.deferred_text
            placement.text = self._text_chain(endpoint, body, namespace, model)
            placement.deferred_text = None
            placement.replica.approximate.record(namespace, placement.text.hashes, time.monotonic())
        text = placement.text
        if prompt_tokens and text is not None and text.num_chars:
            self.tokens_per_char += 0.1 * (prompt_tokens / text.num_chars - self.tokens_per_char)

    def failed(self, placement: Placement) -> None:
        """A request could not reach its replica: take it out until its health check passes."""
        if placement.replica is not None:
            placement.replica.mark_unhealthy()

    def retried(self) -> None:
        """A request that failed on one replica is tried again on another (`failovers` counts these retries)."""
        self.failovers += 1

    def describe(self) -> list[dict[str, Any]]:
        """For `/health`: each replica's state."""
        described = []
        for r in self.replicas:
            subscriber = r.subscriber
            state = "synced" if r.events_synced else ("none" if subscriber is None else "unsynced")
            described.append({
                "url": r.url,
                "healthy": r.healthy,
                "load": r.load,
                "events": state,
                "event_blocks": r.index.blocks_per_tier(),
                "event_block_size": r.index.block_size,
                "event_gaps": subscriber.gaps if subscriber else 0,
                "event_replays": subscriber.replays if subscriber else 0,
                "event_restarts": subscriber.restarts if subscriber else 0,
                "approximate_blocks": r.approximate.num_blocks(),
            })
        return described


def _reachable(endpoint: str, host: str) -> str:
    """`tcp://0.0.0.0:5557` / `tcp://*:5557` (bound on every interface) as `tcp://HOST:5557`."""
    for wildcard in ("tcp://0.0.0.0:", "tcp://*:", "tcp://[::]:"):
        if endpoint.startswith(wildcard):
            return f"tcp://{host}:{endpoint[len(wildcard):]}"
    return endpoint
