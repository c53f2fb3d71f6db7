"""Where one request goes and how to talk to it: an upstream's URLs, headers and timeout, parsed once per upstream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from gateway.config import UpstreamConfig
from gateway.parsing import CHAT
from gateway.upstreams.base import UpstreamAdapter
from gateway.upstreams.registry import adapter_for


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
