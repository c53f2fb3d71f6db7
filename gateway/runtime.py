"""The long-lived objects one gateway process shares between requests."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from gateway.auth import KeyStore
from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from gateway.normalize.pipeline import Pipeline, build_pipeline
from gateway.recording import Recorder
from gateway.routing import Router
from gateway.tenancy import SaltDeriver


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
    """The one shared upstream client: a keep-alive connection pool sized for the gateway's concurrency."""
    limits = httpx.Limits(
        max_connections=config.max_connections,
        max_keepalive_connections=config.max_connections,
        keepalive_expiry=30.0,
    )
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0, connect=5.0), trust_env=False)
