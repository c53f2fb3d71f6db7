"""Model -> upstream routing, with everything per upstream precomputed at start-up."""

from __future__ import annotations

from dataclasses import dataclass

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
    headers: dict[str, str]
    chat_url: str
    completions_url: str

    @property
    def name(self) -> str:
        return self.upstream.name

    def url_for(self, endpoint: str) -> str:
        return self.chat_url if endpoint == CHAT else self.completions_url


def build_route(upstream: UpstreamConfig) -> Route:
    headers = {
        "content-type": "application/json",
        # Streams are relayed byte for byte, so they must arrive uncompressed.
        "accept-encoding": "identity",
    }
    if upstream.api_key:
        headers["authorization"] = f"Bearer {upstream.api_key}"
    return Route(
        upstream=upstream,
        adapter=adapter_for(upstream.kind),
        timeout=httpx.Timeout(upstream.timeout_s, connect=upstream.connect_timeout_s),
        headers=headers,
        chat_url=f"{upstream.api_base}/chat/completions",
        completions_url=f"{upstream.api_base}/completions",
    )


class Router:
    """Picks the upstream for a model: an explicit route, else the default upstream."""

    def __init__(self, config: GatewayConfig) -> None:
        self.routes = {u.name: build_route(u) for u in config.upstreams}
        self._by_model = {model: self.routes[name] for model, name in config.routes.items()}
        self._default = self.routes[config.default_upstream]

    def route(self, model: str) -> Route:
        return self._by_model.get(model, self._default)

    @property
    def default(self) -> Route:
        return self._default
