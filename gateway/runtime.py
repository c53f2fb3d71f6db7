"""The long-lived objects one gateway process shares between requests."""

from __future__ import annotations

from dataclasses import dataclass, field
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx

from gateway.auth import KeyStore
from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from gateway.normalize.pipeline import Pipeline, build_pipeline
from gateway.recording import Recorder
from gateway.routing import Router
from gateway.tenancy import SaltDeriver
from gateway.transport import LeanHTTPTransport


@dataclass
class Runtime:
    config: GatewayConfig
    client: httpx.AsyncClient
    keys: KeyStore
    salts: SaltDeriver
    router: Router
    recorder: Recorder
    metrics: GatewayMetrics
    _pipelines: dict[str, Pipeline] = field(default_factory=dict)

    def pipeline_for(self, tenant: str) -> Pipeline:
        """The tenant's normalization pipeline, built (and its regexes compiled) once per tenant."""
        pipeline = self._pipelines.get(tenant)
        if pipeline is None:
            pipeline = self._pipelines[tenant] = build_pipeline(self.config.tenant_settings(tenant))
        return pipeline


def make_http_client(config: GatewayConfig) -> httpx.AsyncClient:
    """The one shared upstream client with keep-alive connection pools.

    Plain-HTTP upstreams (local engines, vLLM, SGLang on the same network) go through `LeanHTTPTransport`;
    HTTPS upstreams (hosted APIs) through httpx's own transport, which handles TLS and HTTP/2 negotiation.
    Cookies are never kept: the client is shared by all tenants, and an upstream's cookie set for one tenant
    must not be sent on another tenant's request.
    """
    lean = LeanHTTPTransport(max_connections_per_origin=config.max_connections, keepalive_expiry_s=4.0)
    tls = httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_connections=config.max_connections, keepalive_expiry=4.0), trust_env=False
    )
    return httpx.AsyncClient(
        mounts={"http://": lean, "https://": tls},
        timeout=httpx.Timeout(600.0, connect=5.0),
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
        trust_env=False,
    )
