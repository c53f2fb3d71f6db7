"""Model -> upstream routing, with everything per upstream precomputed at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from gateway.config import GatewayConfig, UpstreamConfig
from gateway.parsing import CHAT
from gateway.upstreams import UpstreamAdapter, adapter_for


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes and how to talk to it."""

    upstream: UpstreamConfig
    adapter: UpstreamAdapter
    timeout: httpx.Timeout
    headers: httpx.Headers
    chat_url: httpx.URL
    completions_url: httpx.URL
    match_url: httpx.URL  # the engine's dry-run match (`POST /v1/cache/match`), where the kind has one
    extensions: dict[str, Any]  # the timeout, in the form httpx transports read it

    @property
    def name(self) -> str:
        return self.upstream.name

    def request(self, endpoint: str, payload: bytes) -> httpx.Request:
        """The upstream request for one call; URLs and headers are parsed once per upstream, not per call."""
        url = self.chat_url if endpoint == CHAT else self.completions_url
        return httpx.Request("POST", url, headers=self.headers, content=payload, extensions=self.extensions)


def build_route(upstream: UpstreamConfig) -> Route:
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        # Streams are relayed byte for byte, so they must arrive uncompressed.
        "accept-encoding": "identity",
    }
    if upstream.api_key:
        headers["authorization"] = f"Bearer {upstream.api_key}"
    timeout = httpx.Timeout(upstream.timeout_s, connect=upstream.connect_timeout_s)
    return Route(
        upstream=upstream,
        adapter=adapter_for(upstream.kind),
        timeout=timeout,
        headers=httpx.Headers(headers),
        chat_url=httpx.URL(f"{upstream.api_base}/chat/completions"),
        completions_url=httpx.URL(f"{upstream.api_base}/completions"),
        match_url=httpx.URL(f"{upstream.api_base}/cache/match"),
        extensions={"timeout": timeout.as_dict()},
    )


class Router:
    """Picks the upstream for a model: an explicit route, else the default upstream. Upstreams with replicas get a
    `ReplicaSet` (`replica_sets[name]`) that picks the replica for each request."""

    def __init__(self, config: GatewayConfig) -> None:
        from gateway.replicas.replica_set import ReplicaSet

        self.routes = {u.name: build_route(u) for u in config.upstreams}
        self._by_model = {model: self.routes[name] for model, name in config.routes.items()}
        self._default = self.routes[config.default_upstream]
        self.replica_sets = {u.name: ReplicaSet(u) for u in config.upstreams if u.replicas}

    async def start(self) -> None:
        for replica_set in self.replica_sets.values():
            await replica_set.start()

    async def stop(self) -> None:
        for replica_set in self.replica_sets.values():
            await replica_set.stop()

    def route(self, model: str) -> Route:
        return self._by_model.get(model, self._default)

    @property
    def default(self) -> Route:
        return self._default
