"""How a replica set routes: the policy and its balance rules, health checks, and the two prefix indexes.

Read from an `[[upstreams]]` entry of `prefixscope.toml`::

    [[upstreams]]
    name = "local"
    replicas = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]   # or, with KV events (docs/fleets.md):
    # replicas = [{ url = "http://10.0.0.1:8000", kv_events = "tcp://10.0.0.1:5557",
    #               kv_events_replay = "tcp://10.0.0.1:5558" }, ...]
    routing = "cache_aware"             # cache_aware (default for several replicas) | round_robin | least_loaded
    [upstreams.router]                  # all optional
    balance_abs_threshold = 8           # in-flight requests: route by load when max - min load exceeds this ...
    balance_rel_threshold = 1.5         # ... and max load exceeds this times min load (SGLang router's rule)
    min_match_share = 0.3               # route by load when the best match is below this share of the prompt
    load_penalty_blocks = 1.0           # score = matched blocks - this * in-flight requests
    health_interval = 2.0               # seconds between health checks
    events = true                       # follow the replicas' KV events (configured, or advertised by local engines)
    tokenizer = "/models/m/tokenizer.json"  # or a model directory; local engines serve theirs (GET /v1/tokenizer)
    replay_timeout = 2.0                # seconds to wait for a KV-event replay before counting the events missing
    approx_ttl = 600                    # seconds a block the gateway sent stays in the approximate index
    approx_capacity_tokens = 65536      # tokens one replica's approximate index holds (its pool size)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from db.records import ROUTING_POLICIES
from gateway.errors import ConfigError


@dataclass(frozen=True)
class ReplicaEvents:
    """Where one replica publishes its KV events: the PUB endpoint, the replay (ROUTER) endpoint, the topic."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


@dataclass(frozen=True)
class RouterSettings:
    balance_abs_threshold: int = 8
    balance_rel_threshold: float = 1.5
    min_match_share: float = 0.3
    load_penalty_blocks: float = 1.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    events: bool = True
    replay_timeout_s: float = 2.0
    tokenizer: str | None = None
    approx_ttl_s: float = 600.0
    approx_capacity_tokens: int = 65_536
    # Characters per block of the gateway's own text hash chain (the approximate index: no tokenizer needed).
    approx_block_chars: int = 64
    # Blocks the router routed somewhere stay predicted for this long until the engine's events confirm them.
    pending_ttl_s: float = 30.0


_ALIASES = {
    "health_interval": "health_interval_s",
    "health_timeout": "health_timeout_s",
    "replay_timeout": "replay_timeout_s",
    "approx_ttl": "approx_ttl_s",
    "pending_ttl": "pending_ttl_s",
}


def parse_router_settings(upstream: str, values: Mapping[str, Any]) -> RouterSettings:
    """`[upstreams.router]` -> `RouterSettings`; raises `ConfigError` on unknown keys or bad values."""
    types = {f.name: f.type for f in fields(RouterSettings)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        name = _ALIASES.get(key, key)
        if name not in types:
            raise ConfigError(f"upstream {upstream!r}: unknown [router] key {key!r}")
        if name == "tokenizer":
            if not isinstance(value, str) or not value:
                raise ConfigError(f"upstream {upstream!r}: router tokenizer must be a path")
            kwargs[name] = value
            continue
        cast = {"int": int, "float": float, "bool": bool}[str(types[name])]
        if cast is bool and not isinstance(value, bool):
            raise ConfigError(f"upstream {upstream!r}: router {key} must be true or false")
        try:
            kwargs[name] = cast(value)
        except (TypeError, ValueError):
            raise ConfigError(f"upstream {upstream!r}: router {key} = {value!r} is not a number") from None
    settings = RouterSettings(**kwargs)
    positive = ("health_interval_s", "health_timeout_s", "replay_timeout_s", "approx_ttl_s", "pending_ttl_s",
                "approx_capacity_tokens", "approx_block_chars", "balance_rel_threshold")
    for name in positive:
        if getattr(settings, name) <= 0:
            raise ConfigError(f"upstream {upstream!r}: router {name} must be positive")
    if not 0 <= settings.min_match_share <= 1:
        raise ConfigError(f"upstream {upstream!r}: router min_match_share must be in [0, 1]")
    if settings.balance_abs_threshold < 0 or settings.load_penalty_blocks < 0:
        raise ConfigError(f"upstream {upstream!r}: router thresholds must not be negative")
    return settings


def parse_replicas(upstream: str, value: Any) -> tuple[str, ...]:
    """The replicas' URLs, from URLs or `{url = ..., kv_events = ...}` tables (see `parse_replica_events`)."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"upstream {upstream!r}: replicas must be a non-empty list of URLs")
    value = [item.get("url") if isinstance(item, dict) else item for item in value]
    if not all(isinstance(url, str) for url in value):
        raise ConfigError(f"upstream {upstream!r}: replicas must be URLs or tables with a url")
    for url in value:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"upstream {upstream!r}: replica url must start with http:// or https://")
    if len(set(value)) != len(value):
        raise ConfigError(f"upstream {upstream!r}: replicas are listed twice")
    return tuple(value)


def parse_policy(upstream: str, value: Any, num_replicas: int) -> str:
    if value is None:
        return "cache_aware" if num_replicas > 1 else "round_robin"
    if value not in ROUTING_POLICIES:
        raise ConfigError(f"upstream {upstream!r}: routing must be one of {ROUTING_POLICIES}, not {value!r}")
    return str(value)


_EVENT_KEYS = {"url", "kv_events", "kv_events_replay", "kv_events_topic"}


def parse_replica_events(upstream: str, value: Any) -> tuple[ReplicaEvents | None, ...]:
    """Per replica (in order), where it publishes KV events: `kv_events = "tcp://HOST:PORT"`, optionally
    `kv_events_replay` and `kv_events_topic`; None for a replica given as a plain URL or without `kv_events`."""
    found: list[ReplicaEvents | None] = []
    for item in value if isinstance(value, list) else ():
        if not isinstance(item, dict):
            found.append(None)
            continue
        unknown = set(item) - _EVENT_KEYS
        if unknown:
            raise ConfigError(f"upstream {upstream!r}: unknown replica keys {sorted(unknown)}")
        endpoint, replay, topic = item.get("kv_events"), item.get("kv_events_replay"), item.get("kv_events_topic", "")
        for name, address in (("kv_events", endpoint), ("kv_events_replay", replay)):
            if address is not None and (not isinstance(address, str) or not address.startswith(("tcp://", "ipc://"))):
                raise ConfigError(f"upstream {upstream!r}: replica {name} must be a tcp:// or ipc:// address")
        if replay is not None and endpoint is None:
            raise ConfigError(f"upstream {upstream!r}: replica kv_events_replay needs kv_events")
        if not isinstance(topic, str):
            raise ConfigError(f"upstream {upstream!r}: replica kv_events_topic must be a string")
        found.append(None if endpoint is None else ReplicaEvents(endpoint, replay, topic))
    return tuple(found)
