"""Frozen configuration of the gateway, read from a TOML file plus command-line overrides.

Nothing here reads the process environment: the CLI reads it once and passes values in.

Example `prefixscope.toml`::

    [gateway]
    host = "127.0.0.1"
    port = 8080
    default_upstream = "local"
    max_body_bytes = 8388608
    # server_secret = "..."            # else generated once and kept in secret_file (0600)
    # secret_file = "/srv/prefixscope/gateway_secret"   # default: gateway_secret in the state directory
    # database_url = "postgresql+asyncpg://..."         # default: prefixscope.db in the state directory
    auth = "keys"                       # keys | none (open: no key checked; the same as --open)

    [auth]
    max_key_staleness_s = 60            # refuse requests (503) once the key table has been unreadable this long
    # snapshot_path = "/srv/prefixscope/key_snapshot.json"   # default: key_snapshot.json in the state directory

    [recorder]
    durability = "spill_first"          # spill_first | queue_first (see README: what each mode can lose)

    [[upstreams]]
    name = "local"
    url = "http://127.0.0.1:8001"
    kind = "local_engine"               # local_engine | openai | vllm | sglang | anthropic
    # replicas = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]   # a replica set instead of `url`
    # routing = "cache_aware"           # cache_aware | round_robin | least_loaded (see gateway/replicas/settings.py)
    timeout = 600                       # seconds
    # api_key = "sk-..."

    [[upstreams]]                       # every upstream a route names must be listed
    name = "openai"
    url = "https://api.openai.com"
    kind = "openai"
    # api_key = "sk-..."

    [routes]                            # model -> upstream name; other models go to default_upstream
    "gpt-4o-mini" = "openai"

    [tenant_defaults]
    store_prompt_text = false
    explain_history_size = 1000         # recent requests remembered per tenant to explain misses
    uplift_sample_rate = 0.1            # share of requests whose normalization gain is measured (dry-run match)
    advice_sample_rate = 0.1            # share of requests the rule advisor estimates every rule that is off on
    hash_chain = true                   # record each prompt's block hash chain
    hash_block_size = 16                # tokens per hashed block
    max_cache_retention = "persistent"  # the longest cache retention class a request may get (5m | 1h | persistent)

    [tenants.acme]
    rules = { tool_order = false, hoist_volatile = true }
    volatile_patterns = ['\\d{4}-\\d{2}-\\d{2}']
    cache_retention = "1h"              # the class sent when a request names none (absent: the engine's default)

    [messages]                          # the Anthropic Messages API (see gateway/anthropic/settings.py)
    min_cacheable_tokens = 1024

    [responses]                         # the Responses API's kept responses (see gateway/responses/settings.py)
    store_ttl_s = 3600
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway.anthropic.settings import MessagesSettings, parse_messages_settings
from gateway.errors import ConfigError
from gateway.responses.settings import ResponsesSettings, parse_responses_settings
from gateway.replicas.settings import RouterSettings, parse_policy, parse_replicas, parse_router_settings
from gateway.tenant_settings import (  # noqa: F401 - re-exported: the rule names belong to the configuration
    ALL_RULES,
    HOIST_PLACEMENTS,
    OPT_IN_RULES,
    SEMANTIC_RULES,
    TenantSettings,
    parse_tenant,
)

UPSTREAM_KINDS = ("local_engine", "openai", "vllm", "sglang", "anthropic")

DEFAULT_UPSTREAM_URL = "http://127.0.0.1:8001"
DEFAULT_SECRET_FILE = Path("var/gateway_secret")
DEFAULT_SPILL_PATH = Path("var/spill/gateway_requests.jsonl")
DEFAULT_KEY_SNAPSHOT_PATH = Path("var/key_snapshot.json")
AUTH_MODES = ("keys", "none")
DURABILITY_MODES = ("queue_first", "spill_first")


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
class RecorderConfig:
    """Sizing of the background record writer (passed on to `db.writer.WriterConfig`)."""

    queue_size: int = 50_000
    # Large batches let the writer keep up when the event loop is saturated: each batch costs a fixed number of
    # round trips through the loop, whatever its size. At modest rates batches stay small (one per interval).
    batch_size: int = 2048
    flush_interval_s: float = 0.25
    spill_path: Path = DEFAULT_SPILL_PATH
    replay_interval_s: float = 5.0
    # spill_first: a record is appended to the journal next to the spill file before it is queued (default: it adds
    # about 0.02 ms to the request path, see `prefixscope bench gateway`). queue_first: a record waits in memory and
    # reaches disk (database or spill file) within a batch interval.
    durability: str = "spill_first"
    journal_fsync_interval_s: float = 0.005


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
    recorder: RecorderConfig = RecorderConfig()
    auth: str = "keys"  # "none": open mode, the operator's explicit choice
    max_key_staleness_s: float = 60.0
    key_snapshot_path: Path | None = DEFAULT_KEY_SNAPSHOT_PATH
    messages: MessagesSettings = MessagesSettings()
    responses: ResponsesSettings = ResponsesSettings()

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


def load_config(path: Path | None, overrides: ConfigOverrides = ConfigOverrides()) -> GatewayConfig:
    """Read `path` (TOML) if given, apply `overrides` and validate. Raises `ConfigError` on any problem."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
    return apply_overrides(parse_config(data), overrides)


def parse_config(data: Mapping[str, Any]) -> GatewayConfig:
    """Build a `GatewayConfig` from the parsed TOML document."""
    unknown = set(data) - {"gateway", "upstreams", "routes", "tenant_defaults", "tenants", "recorder", "auth", "messages",
                       "responses"}
    if unknown:
        raise ConfigError(f"unknown config sections: {sorted(unknown)}")
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
    replicas = parse_replicas(str(values.get("name")), values.pop("replicas")) if "replicas" in values else ()
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


def _parse_recorder(values: dict[str, Any]) -> RecorderConfig:
    base = RecorderConfig()
    config = RecorderConfig(
        queue_size=int(values.pop("queue_size", base.queue_size)),
        batch_size=int(values.pop("batch_size", base.batch_size)),
        flush_interval_s=float(values.pop("flush_interval_s", base.flush_interval_s)),
        spill_path=Path(values.pop("spill_path", base.spill_path)),
        replay_interval_s=float(values.pop("replay_interval_s", base.replay_interval_s)),
        durability=str(values.pop("durability", base.durability)),
        journal_fsync_interval_s=float(values.pop("journal_fsync_interval_s", base.journal_fsync_interval_s)),
    )
    if values:
        raise ConfigError(f"unknown [recorder] keys: {sorted(values)}")
    if config.durability not in DURABILITY_MODES:
        raise ConfigError(f"[recorder] durability must be one of {DURABILITY_MODES}, not {config.durability!r}")
    if config.journal_fsync_interval_s <= 0:
        raise ConfigError("[recorder] journal_fsync_interval_s must be positive")
    return config


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
