"""The one shared upstream HTTP client."""

from __future__ import annotations

from typing import Any

import httpx

from gateway.config import GatewayConfig
from gateway.transport import LeanHTTPTransport

# Servers such as uvicorn drop idle keep-alive connections after 5 s; close ours first.
KEEPALIVE_EXPIRY_S = 4.0


class _NoCookies(httpx.Cookies):
    """A cookie store that never stores anything."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class ProxyClient(httpx.AsyncClient):
    """`httpx.AsyncClient` without a cookie store.

    The client is shared by every tenant, so a cookie an upstream sets while serving one tenant must never be
    sent with another tenant's request; skipping the cookie jar also saves its per-response work.
    """

    _no_cookies = _NoCookies()

    @property  # type: ignore[override]
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies

    @cookies.setter
    def cookies(self, value: Any) -> None:
        return None


def make_http_client(config: GatewayConfig) -> ProxyClient:
    """Keep-alive connection pools for every upstream.

    Plain-HTTP upstreams (local engines, vLLM, SGLang) go through `LeanHTTPTransport`; HTTPS upstreams (hosted
    APIs) through httpx's own transport, which does TLS.
    """
    lean = LeanHTTPTransport(max_connections_per_origin=config.max_connections, keepalive_expiry_s=KEEPALIVE_EXPIRY_S)
    tls = httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_connections=config.max_connections, keepalive_expiry=KEEPALIVE_EXPIRY_S),
        trust_env=False,
    )
    return ProxyClient(
        mounts={"http://": lean, "https://": tls},
        timeout=httpx.Timeout(600.0, connect=5.0),
        trust_env=False,
    )
