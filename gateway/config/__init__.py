"""The gateway's settings, below every feature: this package imports no feature module, and features import it.

Where each setting lives: `settings` (the listen address, upstreams, routes, auth; `GatewayConfig` holds them all),
`tenant` (`[tenant_defaults]`, `[tenants.NAME]`), `retention` (a tenant's cache retention classes),
`volatile_patterns` (the default patterns of `hoist_volatile`), `router` (`[upstreams.router]`: routing over a
replica set), `messages` (`[messages]`: the Anthropic Messages API), `responses` (`[responses]`: the responses kept
for the Responses API), `telemetry` (`[telemetry]`: where request spans go), and `db.writer_config.WriterConfig` (`[recorder]`,
the record writer's settings, shared with db). `loading` reads the TOML file and the command line into them.
Nothing here reads the process environment: the CLI reads it once and passes values in.

The configuration file is described in docs/gateway.md; `examples/prefixscope.toml` shows every section and loads
as it is (a test loads it).
"""

from __future__ import annotations

from db.writer_config import DEFAULT_SPILL_PATH, DURABILITY_MODES, WriterConfig
from gateway.config.loading import apply_overrides, load_config, parse_config
from gateway.config.messages import MessagesSettings
from gateway.config.router import ROUTING_POLICIES, RouterSettings
from gateway.config.settings import (
    AUTH_MODES,
    DEFAULT_KEY_SNAPSHOT_PATH,
    DEFAULT_SECRET_FILE,
    DEFAULT_UPSTREAM_URL,
    UPSTREAM_KINDS,
    ConfigOverrides,
    GatewayConfig,
    UpstreamConfig,
)
from gateway.config.telemetry import TelemetrySettings
from gateway.config.tenant import ALL_RULES, HOIST_PLACEMENTS, OPT_IN_RULES, SEMANTIC_RULES, TenantSettings

__all__ = [
    "ALL_RULES",
    "AUTH_MODES",
    "DEFAULT_KEY_SNAPSHOT_PATH",
    "DEFAULT_SECRET_FILE",
    "DEFAULT_SPILL_PATH",
    "DEFAULT_UPSTREAM_URL",
    "DURABILITY_MODES",
    "HOIST_PLACEMENTS",
    "OPT_IN_RULES",
    "ROUTING_POLICIES",
    "SEMANTIC_RULES",
    "UPSTREAM_KINDS",
    "ConfigOverrides",
    "GatewayConfig",
    "MessagesSettings",
    "RouterSettings",
    "TelemetrySettings",
    "TenantSettings",
    "UpstreamConfig",
    "WriterConfig",
    "apply_overrides",
    "load_config",
    "parse_config",
]
