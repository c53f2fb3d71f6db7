"""How a replica set routes: the policy and its balance rules, health checks, and the two prefix indexes.

Read from an `[[upstreams]]` entry of `prefixscope.toml`::

    [[upstreams]]
    name = "local"
    replicas = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    routing = "cache_aware"             # cache_aware (default for several replicas) | round_robin | least_loaded
    [upstreams.router]                  # all optional
    balance_abs_threshold = 8           # in-flight requests: route by load when max - min load exceeds this ...
    balance_rel_threshold = 1.5         # ... and max load exceeds this times min load (SGLang router's rule)
    min_match_share = 0.3               # route by load when the best match is below this share of the prompt
    load_penalty_blocks = 1.0           # score = matched blocks - this * in-flight requests
    health_interval = 2.0               # seconds between health checks
    events = true                       # follow the engine's cache events (local_engine only)
    event_poll_interval = 0.2           # seconds between event polls when nothing new came
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
class RouterSettings:
    balance_abs_threshold: int = 8
    balance_rel_threshold: float = 1.5
    min_match_share: float = 0.3
    load_penalty_blocks: float = 1.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    events: bool = True
    event_poll_interval_s: float = 0.2
    approx_ttl_s: float = 600.0
    approx_capacity_tokens: int = 65_536
    # Characters per block of the gateway's own text hash chain (the approximate index: no tokenizer needed).
    approx_block_chars: int = 64
    # Blocks the router routed somewhere stay predicted for this long until the engine's events confirm them.
    pending_ttl_s: float = 30.0


_ALIASES = {
    "health_interval": "health_interval_s",
    "health_timeout": "health_timeout_s",
    "event_poll_interval": "event_poll_interval_s",
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
        cast = {"int": int, "float": float, "bool": bool}[str(types[name])]
        if cast is bool and not isinstance(value, bool):
            raise ConfigError(f"upstream {upstream!r}: router {key} must be true or false")
        try:
            kwargs[name] = cast(value)
        except (TypeError, ValueError):
            raise ConfigError(f"upstream {upstream!r}: router {key} = {value!r} is not a number") from None
    settings = RouterSettings(**kwargs)
    positive = ("health_interval_s", "health_timeout_s", "event_poll_interval_s", "approx_ttl_s", "pending_ttl_s",
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
    if not isinstance(value, list) or not value or not all(isinstance(url, str) for url in value):
        raise ConfigError(f"upstream {upstream!r}: replicas must be a non-empty list of URLs")
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
