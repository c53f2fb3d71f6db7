"""A replica set: several engines behind one upstream name, and the choice of one of them for each request.

`place` predicts, for every healthy replica, how many of the request's prompt tokens it holds (from the engine's
cache events when they are followed, else from what the gateway itself sent there), and lets the policy
(`gateway.replicas.policy`) choose. For the precise index the request's token block hashes come from one engine's
dry-run match (`POST /v1/cache/match` with `return_hash_chain`), since the gateway has no tokenizer; a prompt whose
first text block this gateway sent to no replica lately is taken as a new prefix and placed by load without that
round trip (with several gateways in front of one set, each knows only its own traffic there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import msgspec

from gateway.config import UpstreamConfig
from gateway.errors import UpstreamUnavailable
from gateway.replicas.follower import event_loop, health_loop
from gateway.replicas.index import ApproximateIndex, PreciseIndex
from gateway.replicas.policy import Candidate, choose
from gateway.replicas.text_chain import TextChain, prompt_material, text_chain
from gateway.upstreams.route import Route, build_route

_ENCODER = msgspec.json.Encoder()
SCORE_BLOCK_TOKENS = 16  # the unit of `matched blocks` in the score, whatever index the prediction came from
_DEFAULT_TOKENS_PER_CHAR = 0.25


class Replica:
    """One engine of a set: its route, health, in-flight load and the two indexes of what it caches."""

    def __init__(self, upstream: UpstreamConfig, url: str, position: int) -> None:
        self.url = url
        self.position = position
        self.route: Route = build_route(replace(upstream, url=url, replicas=()))
        root = self.route.upstream.server_root
        self.health_url = f"{root}/health"
        self.events_url = f"{root}/v1/cache/events"
        self.snapshot_url = f"{root}/v1/cache/events/snapshot"
        self.auth_headers = {"authorization": f"Bearer {upstream.api_key}"} if upstream.api_key else {}
        settings = upstream.router
        self.precise = PreciseIndex()
        self.approximate = ApproximateIndex(
            max(1, int(settings.approx_capacity_tokens / _DEFAULT_TOKENS_PER_CHAR) // settings.approx_block_chars),
            settings.approx_ttl_s,
        )
        self.healthy = True
        self.load = 0
        self.publishes_events: bool | None = None
        self.events_synced = False
        self.event_epoch: str | None = None
        self.event_cursor = 0
        self.event_block_size = 16
        self.resyncs = 0
        self.gaps = 0
        self.taken_out = 0

    def mark_unhealthy(self) -> None:
        if self.healthy:
            self.taken_out += 1
        self.healthy = False
        self.events_synced = False

    def mark_healthy(self) -> None:
        self.healthy = True
        self.events_synced = False
        self.approximate.clear()


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


class ReplicaSet:
    def __init__(self, upstream: UpstreamConfig) -> None:
        self.upstream = upstream
        self.policy = upstream.routing
        self.settings = upstream.router
        self.replicas = [Replica(upstream, url, i) for i, url in enumerate(upstream.replicas)]
        self.tokens_per_char = _DEFAULT_TOKENS_PER_CHAR
        self.failovers = 0
        self._turn = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._client: httpx.AsyncClient | None = None

    @property
    def name(self) -> str:
        return self.upstream.name

    async def start(self) -> None:
        settings = self.settings
        self._client = httpx.AsyncClient(timeout=settings.health_timeout_s, trust_env=False)
        for replica in self.replicas:
            self._tasks.append(asyncio.create_task(health_loop(self._client, replica, settings.health_interval_s)))
            if settings.events and self.upstream.kind == "local_engine":
                self._tasks.append(
                    asyncio.create_task(event_loop(self._client, replica, settings.event_poll_interval_s))
                )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._client is not None:
            await self._client.aclose()

    # ---- placement ----------------------------------------------------------------------------------------------

    async def place(
        self, client: httpx.AsyncClient, endpoint: str, body: dict[str, Any], namespace: str, model: str,
        excluded: Sequence[str] = (),
    ) -> Placement:
        """Choose a replica for `body` (the final upstream request, salt applied) and count it as loaded. Raises
        `UpstreamUnavailable` when every replica was excluded."""
        allowed = [r for r in self.replicas if r.url not in excluded]
        if not allowed:
            raise UpstreamUnavailable(f"every replica of {self.name!r} failed this request")
        candidates = [r for r in allowed if r.healthy] or allowed
        self._turn += 1
        now = time.monotonic()
        text = text_chain(namespace, model, prompt_material(endpoint, body), self.settings.approx_block_chars)
        if self.policy != "cache_aware":
            pool = [Candidate(r.position, r.load) for r in candidates]
            chosen = choose(self.policy, pool, self.settings, self._turn, 0)
            return self._placed(chosen.position, chosen.reason, None, None, text, namespace, None, now, excluded)
        # A prompt whose first text block no replica was sent recently, in a namespace no engine reports holding
        # anything of, is a new prefix: route it by load without asking an engine to hash it. A namespace an engine
        # does hold (after a gateway restart, or once the text index aged out) is always looked up precisely.
        known = any(r.approximate.match_blocks(namespace, text.hashes[:1], now) for r in candidates) or any(
            r.events_synced and r.precise.holds_namespace(namespace) for r in candidates
        )
        tokens = await self._token_chain(client, candidates, body) if known or not text.hashes else None
        prompt_tokens = tokens[1] if tokens else round(text.num_chars * self.tokens_per_char)
        predictions = {r.position: self._predict(r, namespace, text, tokens, prompt_tokens, now) for r in candidates}
        pool = [
            Candidate(r.position, r.load, predictions[r.position][0] // SCORE_BLOCK_TOKENS, predictions[r.position][0],
                      r.precise.num_blocks() + r.approximate.num_blocks())
            for r in candidates
        ]
        chosen = choose(self.policy, pool, self.settings, self._turn, prompt_tokens)
        predicted, source = predictions[chosen.position]
        return self._placed(chosen.position, chosen.reason, predicted, source, text, namespace, tokens, now, excluded)

    def _predict(
        self, replica: Replica, namespace: str, text: TextChain, tokens: tuple[list[int], int, int] | None,
        prompt_tokens: int, now: float,
    ) -> tuple[int, str]:
        """(predicted cached tokens, index source) for one replica; at most all but the last prompt token."""
        limit = max(0, prompt_tokens - 1)
        if tokens is not None and replica.events_synced and replica.event_block_size == tokens[2]:
            return min(limit, replica.precise.match_blocks(namespace, tokens[0], now) * tokens[2]), "precise"
        blocks = replica.approximate.match_blocks(namespace, text.hashes, now)
        return min(limit, round(blocks * text.block_chars * self.tokens_per_char)), "approximate"

    def _placed(
        self, position: int, reason: str, predicted: int | None, source: str | None, text: TextChain,
        namespace: str, tokens: tuple[list[int], int, int] | None, now: float, excluded: Sequence[str],
    ) -> Placement:
        replica = self.replicas[position]
        replica.load += 1
        replica.approximate.record(namespace, text.hashes, now)
        if tokens is not None:
            replica.precise.expect(namespace, tokens[0], now + self.settings.pending_ttl_s)
        return Placement(replica.route, replica, self.policy, reason, predicted, source, text, list(excluded))

    async def _token_chain(
        self, client: httpx.AsyncClient, candidates: Sequence[Replica], body: dict[str, Any]
    ) -> tuple[list[int], int, int] | None:
        """(block hashes, prompt tokens, block size) of the request from the least loaded replica whose events are
        followed, or None when none is (or it could not say)."""
        synced = [r for r in candidates if r.events_synced]
        if not synced:
            return None
        probe = min(synced, key=lambda r: (r.load, r.position))
        request = {**body, "stream": False, "return_hash_chain": True, "hash_block_size": probe.event_block_size}
        request.pop("stream_options", None)
        try:
            response = await client.post(
                str(probe.route.match_url), content=_ENCODER.encode(request), headers=probe.route.headers,
                timeout=self.settings.health_timeout_s,
            )
            if response.status_code != 200:
                return None
            chain = response.json()["hash_chain"]
            return [int(h) for h in chain["hash_ids"]], int(chain["input_length"]), int(chain["block_size"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    # ---- outcome ------------------------------------------------------------------------------------------------

    def release(self, placement: Placement, prompt_tokens: int | None) -> None:
        """The request is done with its replica; learn the characters-per-token ratio from its usage."""
        if placement.replica is None:
            return
        placement.replica.load -= 1
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
        return [
            {
                "url": r.url,
                "healthy": r.healthy,
                "load": r.load,
                "events": "synced" if r.events_synced else ("none" if r.publishes_events is False else "unsynced"),
                "precise_blocks": r.precise.num_blocks(),
                "approximate_blocks": r.approximate.num_blocks(),
            }
            for r in self.replicas
        ]
