"""The long-lived objects one gateway process shares between requests."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from gateway.auth import KeyStore
from gateway.config import GatewayConfig
from gateway.conversations.returned import ReturnedCalls
from gateway.metrics import GatewayMetrics
from gateway.normalize.pipeline import Pipeline, build_pipeline
from gateway.provider_diagnostics import Baselines
from gateway.recording import Recorder
from gateway.routing import Router
from gateway.telemetry.request_span import RequestSpans
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
    # The tenant's latest upstream response per prefix, compared with by providers' cache diagnostics.
    baselines: Baselines = field(default_factory=Baselines)
    spans: RequestSpans | None = None  # one OpenTelemetry span per request, when [telemetry] exports them
    # The tool calls answers gave each tenant (the conversation tracker's), which the tenants' pipelines write re-sent
    # calls back as; None: tool calls are left as sent.
    returned_calls: ReturnedCalls | None = None
    _pipelines: dict[str, Pipeline] = field(default_factory=dict)

    def pipeline_for(self, tenant: str) -> Pipeline:
        """The tenant's normalization pipeline, built (and its regexes compiled) once per tenant."""
        pipeline = self._pipelines.get(tenant)
        if pipeline is None:
            returned = None if self.returned_calls is None else self.returned_calls.lookup_for(tenant)
            pipeline = self._pipelines[tenant] = build_pipeline(self.config.tenant_settings(tenant), returned)
        return pipeline
