"""Reading `prefixscope.toml` (see `examples/prefixscope.toml`) and the command line into a `GatewayConfig`.

Nothing here reads the process environment: the CLI reads it once and passes values in. Every error is a
`ConfigError` that names the section and key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import tomllib

from db.retention.costs import PriceError
from db.retention.prices import UpstreamPrices
from db.writer_config import WriterConfig
from gateway.config.messages import parse_messages_settings
from gateway.config.responses import parse_responses_settings
from gateway.config.router import parse_policy, parse_replica_events, parse_replicas, parse_router_settings
from gateway.config.settings import AUTH_MODES, UPSTREAM_KINDS, ConfigOverrides, GatewayConfig, UpstreamConfig
from gateway.config.telemetry import parse_telemetry_settings
from gateway.config.tenant import TenantSettings, parse_tenant
from gateway.errors import ConfigError

SECTIONS = frozenset(
    {"gateway", "upstreams", "routes", "tenant_defaults", "tenants", "recorder", "auth", "messages", "responses",
     "telemetry"}
)
# `[advice]` is read by `prefixscope advise` (db.retention.prices); it is checked here so a bad one is refused at start.
ADVICE_SECTION = "advice"


def load_config(path: Path | None, overrides: ConfigOverrides = ConfigOverrides()) -> GatewayConfig:
    """Read `path` (TOML) if given, apply `overrides` and validate. Raises `ConfigError` on any problem."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
    return apply_overrides(parse_config(data), overrides)


def check_prices(data: Mapping[str, Any]) -> None:
    """Raises `ConfigError` when `[advice.cache_prices]` is malformed."""
    try:
        UpstreamPrices.from_config(data)
    except PriceError as exc:
        raise ConfigError(str(exc)) from exc


def parse_config(data: Mapping[str, Any]) -> GatewayConfig:
    """Build a `GatewayConfig` from the parsed TOML document."""
    unknown = set(data) - SECTIONS - {ADVICE_SECTION}
    if unknown:
        raise ConfigError(f"unknown config sections: {sorted(unknown)}")
    check_prices(data)
    section = dict(data.get("gateway", {}))
    upstreams = tuple(_parse_upstream(item) for item in data.get("upstreams", ())) or GatewayConfig.upstreams
    names = [u.name for u in upstreams]
    if len(set(names)) != len(names):
        raise ConfigError(f"duplicate upstream names: {names}")
    default_upstream = str(section.pop("default_upstream", names[0]))
    routes = {str(model): str(name) for model, name in dict(data.get("routes", {})).items()}
    for name in [default_upstream, *routes.values()]:
        if name not in names:
            raise ConfigError(f"route to unknown upstream {name!r}; known: {names}")
    try:
        tenant_defaults = parse_tenant(dict(data.get("tenant_defaults", {})), TenantSettings())
    except ConfigError as exc:
        raise ConfigError(f"[tenant_defaults] {exc}") from None
    tenants = {
        str(tenant): _parse_named_tenant(str(tenant), values, tenant_defaults)
        for tenant, values in dict(data.get("tenants", {})).items()
    }
    recorder = _parse_recorder(dict(data.get("recorder", {})))
    kwargs: dict[str, Any] = _parse_auth(dict(data.get("auth", {})))
    for key, cast in (
        ("host", str),
        ("port", int),
        ("database_url", str),
        ("server_secret", str),
        ("secret_file", Path),
        ("max_body_bytes", int),
        ("key_refresh_interval_s", float),
        ("max_connections", int),
        ("auth", str),
    ):
        if key in section:
            value = section.pop(key)
            try:
                kwargs[key] = cast(value)
            except (TypeError, ValueError):
                raise ConfigError(f"[gateway] {key} = {value!r} is not a valid {cast.__name__}") from None
    if section:
        raise ConfigError(f"unknown [gateway] keys: {sorted(section)}")
    if kwargs.get("auth", "keys") not in AUTH_MODES:
        raise ConfigError(f"[gateway] auth must be one of {AUTH_MODES}, not {kwargs['auth']!r}")
    if kwargs.get("max_body_bytes", 1) <= 0:
        raise ConfigError("max_body_bytes must be positive")
    return GatewayConfig(
        upstreams=upstreams,
        default_upstream=default_upstream,
        routes=routes,
        tenant_defaults=tenant_defaults,
        tenants=tenants,
        recorder=recorder,
        messages=parse_messages_settings(dict(data.get("messages", {}))),
        responses=parse_responses_settings(dict(data.get("responses", {}))),
        telemetry=parse_telemetry_settings(dict(data.get("telemetry", {}))),
        **kwargs,
    )


def apply_overrides(config: GatewayConfig, overrides: ConfigOverrides) -> GatewayConfig:
    changes: dict[str, Any] = {}
    if overrides.host is not None:
        changes["host"] = overrides.host
    if overrides.port is not None:
        changes["port"] = overrides.port
    if overrides.database_url is not None:
        changes["database_url"] = overrides.database_url
    if overrides.server_secret is not None:
        changes["server_secret"] = overrides.server_secret
    if overrides.open_mode:
        changes["auth"] = "none"
    if overrides.upstream_api_key is not None:
        config = replace(
            config,
            upstreams=tuple(
                replace(u, api_key=overrides.upstream_api_key)
                if u.name == config.default_upstream and u.api_key is None
                else u
                for u in config.upstreams
            ),
        )
    if overrides.upstream_url is not None:
        # --upstream replaces the default upstream's URL (keeping its kind), so `--upstream URL` alone just works.
        changes["upstreams"] = tuple(
            replace(u, url=overrides.upstream_url) if u.name == config.default_upstream else u for u in config.upstreams
        )
    if overrides.replica_urls or overrides.routing is not None:
        changes["upstreams"] = tuple(
            _override_replicas(u, overrides) if u.name == config.default_upstream else u
            for u in changes.get("upstreams", config.upstreams)
        )
    return replace(config, **changes) if changes else config


def _override_replicas(upstream: UpstreamConfig, overrides: ConfigOverrides) -> UpstreamConfig:
    replicas = upstream.replicas
    if overrides.replica_urls:
        replicas = parse_replicas(upstream.name, list(overrides.replica_urls))
    url = replicas[0] if replicas else upstream.url
    routing = parse_policy(upstream.name, overrides.routing, len(replicas))
    return replace(upstream, url=url, replicas=replicas, routing=routing)


def _parse_upstream(item: Mapping[str, Any]) -> UpstreamConfig:
    values = dict(item)
    raw_replicas = values.pop("replicas", None)
    replicas = parse_replicas(str(values.get("name")), raw_replicas) if raw_replicas is not None else ()
    replica_events = parse_replica_events(str(values.get("name")), raw_replicas)
    if replicas:
        values.setdefault("url", replicas[0])
    try:
        name = str(values.pop("name"))
        url = str(values.pop("url"))
    except KeyError as exc:
        raise ConfigError(f"an [[upstreams]] entry lacks {exc.args[0]!r}") from exc
    routing = parse_policy(name, values.pop("routing", None), len(replicas))
    router = parse_router_settings(name, dict(values.pop("router", {})))
    kind = str(values.pop("kind", "local_engine"))
    if kind not in UPSTREAM_KINDS:
        raise ConfigError(f"upstream {name!r}: kind must be one of {UPSTREAM_KINDS}, not {kind!r}")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"upstream {name!r}: url must start with http:// or https://")
    timeout_s = float(values.pop("timeout", values.pop("timeout_s", 600.0)))
    connect_timeout_s = float(values.pop("connect_timeout", values.pop("connect_timeout_s", 5.0)))
    api_key = values.pop("api_key", None)
    if values:
        raise ConfigError(f"upstream {name!r}: unknown keys {sorted(values)}")
    if timeout_s <= 0 or connect_timeout_s <= 0:
        raise ConfigError(f"upstream {name!r}: timeouts must be positive")
    return UpstreamConfig(
        name=name,
        url=url,
        kind=kind,
        api_key=None if api_key is None else str(api_key),
        timeout_s=timeout_s,
        connect_timeout_s=connect_timeout_s,
        replicas=replicas,
        replica_events=replica_events,
        routing=routing,
        router=router,
    )


def _parse_named_tenant(tenant: str, values: Any, defaults: TenantSettings) -> TenantSettings:
    """A `[tenants.NAME]` table over the defaults; errors name the table."""
    if not isinstance(values, dict):
        raise ConfigError(f"[tenants.{tenant}] must be a table")
    try:
        return parse_tenant(dict(values), defaults)
    except ConfigError as exc:
        raise ConfigError(f"[tenants.{tenant}] {exc}") from None


_RECORDER_CASTS = {"int": int, "float": float, "str": str, "Path": Path}


def _parse_recorder(values: dict[str, Any]) -> WriterConfig:
    """The `[recorder]` table: one key per `WriterConfig` field, over its defaults."""
    kinds = {f.name: str(f.type) for f in fields(WriterConfig)}
    unknown = set(values) - set(kinds)
    if unknown:
        raise ConfigError(f"unknown [recorder] keys: {sorted(unknown)}")
    parsed: dict[str, Any] = {}
    for key, value in values.items():
        cast = _RECORDER_CASTS[kinds[key]]
        try:
            parsed[key] = cast(value)
        except (TypeError, ValueError):
            raise ConfigError(f"[recorder] {key} = {value!r} is not a valid {cast.__name__}") from None
    try:
        return WriterConfig(**parsed)
    except ValueError as exc:
        raise ConfigError(f"[recorder] {exc}") from None


def _parse_auth(values: dict[str, Any]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    if "max_key_staleness_s" in values:
        try:
            parsed["max_key_staleness_s"] = float(values.pop("max_key_staleness_s"))
        except (TypeError, ValueError):
            raise ConfigError("[auth] max_key_staleness_s must be a number of seconds") from None
        if parsed["max_key_staleness_s"] <= 0:
            raise ConfigError("[auth] max_key_staleness_s must be positive")
    if "snapshot_path" in values:
        raw = values.pop("snapshot_path")
        parsed["key_snapshot_path"] = Path(raw) if raw else None
    if values:
        raise ConfigError(f"unknown [auth] keys: {sorted(values)}")
    return parsed
