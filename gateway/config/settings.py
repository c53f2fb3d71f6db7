"""The gateway's settings as frozen values: the listen address, upstreams, routes, tenants, recorder and auth.

Build them with `gateway.config.load_config`; the example `prefixscope.toml` is `examples/prefixscope.toml`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from db.writer_config import WriterConfig
from gateway.config.messages import MessagesSettings
from gateway.config.responses import ResponsesSettings
from gateway.config.router import ReplicaEvents, RouterSettings
from gateway.config.telemetry import TelemetrySettings
from gateway.config.tenant import TenantSettings
from gateway.errors import ConfigError

UPSTREAM_KINDS = ("local_engine", "openai", "vllm", "sglang", "anthropic")

DEFAULT_UPSTREAM_URL = "http://127.0.0.1:8001"
DEFAULT_SECRET_FILE = Path("var/gateway_secret")
DEFAULT_KEY_SNAPSHOT_PATH = Path("var/key_snapshot.json")
AUTH_MODES = ("keys", "none")


@dataclass(frozen=True)
class UpstreamConfig:
    """One engine the gateway forwards to. `url` is the server's base URL, with or without a trailing `/v1`."""

    name: str
    url: str
    kind: str = "local_engine"
    api_key: str | None = None
    timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    # A replica set (several engines serving the same model) and how to route over it (`gateway.replicas`).
    replicas: tuple[str, ...] = ()
    replica_events: tuple[ReplicaEvents | None, ...] = ()  # per replica: where it publishes KV events
    routing: str = "round_robin"
    router: RouterSettings = RouterSettings()

    @property
    def api_base(self) -> str:
        """The base URL that `/chat/completions` and friends hang off (always ends in `/v1`)."""
        base = self.url.rstrip("/")
        return base if base.endswith("/v1") else base + "/v1"

    @property
    def server_root(self) -> str:
        """The URL without the `/v1` suffix, where `/health` lives."""
        base = self.url.rstrip("/")
        return base[: -len("/v1")] if base.endswith("/v1") else base


@dataclass(frozen=True)
class GatewayConfig:
    """Everything the gateway needs to start. Build it with `load_config`."""

    upstreams: tuple[UpstreamConfig, ...] = (UpstreamConfig(name="local", url=DEFAULT_UPSTREAM_URL),)
    default_upstream: str = "local"
    routes: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8080
    database_url: str | None = None
    server_secret: str | None = None
    secret_file: Path = DEFAULT_SECRET_FILE
    max_body_bytes: int = 8 * 1024 * 1024
    key_refresh_interval_s: float = 5.0
    max_connections: int = 512
    tenant_defaults: TenantSettings = TenantSettings()
    tenants: Mapping[str, TenantSettings] = field(default_factory=dict)
    recorder: WriterConfig = WriterConfig()  # the `[recorder]` section: the record writer's settings
    auth: str = "keys"  # "none": open mode, the operator's explicit choice
    max_key_staleness_s: float = 60.0
    key_snapshot_path: Path | None = DEFAULT_KEY_SNAPSHOT_PATH
    messages: MessagesSettings = MessagesSettings()
    responses: ResponsesSettings = ResponsesSettings()
    telemetry: TelemetrySettings = TelemetrySettings()  # `[telemetry]`: where request spans go (off by default)

    @property
    def open_mode(self) -> bool:
        """Whether the gateway serves without API keys (`auth = "none"` or `--open`)."""
        return self.auth == "none"

    def upstream(self, name: str) -> UpstreamConfig:
        for upstream in self.upstreams:
            if upstream.name == name:
                return upstream
        raise ConfigError(f"unknown upstream {name!r}")

    def tenant_settings(self, tenant: str) -> TenantSettings:
        return self.tenants.get(tenant, self.tenant_defaults)


@dataclass(frozen=True)
class ConfigOverrides:
    """Command-line values that win over the file."""

    host: str | None = None
    port: int | None = None
    upstream_url: str | None = None
    replica_urls: tuple[str, ...] = ()  # several --upstream URLs: the default upstream becomes a replica set
    routing: str | None = None
    database_url: str | None = None
    server_secret: str | None = None
    open_mode: bool | None = None  # --open
    upstream_api_key: str | None = None  # for the default upstream, when the file gives it none
