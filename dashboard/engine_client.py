"""Read-only client for the engine's cache API (`GET /v1/cache`, `GET /v1/cache/tree`), over HTTP only.

The dashboard never imports the engine; it asks a running one. Any failure (refused connection, timeout, non-2xx,
malformed JSON) becomes `EngineUnavailable` with a one-line reason the page can show. An engine from before cache
tiers sends no `tiers` object: `CacheStats.tiers` is then None, and the page says so rather than failing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx


class EngineUnavailable(Exception):
    """The engine could not be reached or answered something unusable."""


# The engine's tiers, fastest first (`tiers` keys of `/v1/cache`).
TIER_NAMES = ("device", "host", "disk")


@dataclass(frozen=True)
class TierStats:
    """One tier of the engine's cache (`/v1/cache` `tiers[name]`): occupancy in tokens (and capacity in bytes), and
    counters since the engine started: tokens served from it (`hit_tokens_total`), loads back to the device (count,
    tokens, ms), tokens demoted to the next tier and tokens dropped for good; corrupt files found (disk only)."""

    name: str
    enabled: bool
    capacity_tokens: int
    cached_tokens: int
    free_tokens: int
    evictable_tokens: int
    protected_tokens: int
    capacity_bytes: int
    hit_tokens_total: int
    loads_total: int
    load_tokens_total: int
    load_ms_total: float
    demoted_tokens_total: int
    dropped_tokens_total: int
    corrupt_files_total: int

    @property
    def used_share(self) -> float:
        """Cached tokens as a share of capacity (0 for a tier without capacity)."""
        return self.cached_tokens / self.capacity_tokens if self.capacity_tokens else 0.0

    @property
    def load_ms_mean(self) -> float | None:
        """Mean time of one load back to the device; None before the first."""
        return self.load_ms_total / self.loads_total if self.loads_total else None


@dataclass(frozen=True)
class CacheStats:
    """The engine's `/v1/cache` answer; `prefill_tokens_per_s` is None until the engine has measured it.

    Token counts are KV pool slots: `protected` are held by running requests' cached prefixes, `evictable` hold
    cached prefixes nobody uses right now, `free` hold nothing; whatever else is used belongs to running requests'
    new tokens that are not in the tree yet.
    """

    capacity_tokens: int
    used_tokens: int
    free_tokens: int
    evictable_tokens: int
    protected_tokens: int
    num_nodes: int
    evicted_tokens_total: int
    expired_tokens_total: int
    prefill_tokens_per_s: float | None
    raw: dict[str, Any] = field(default_factory=dict)
    # The cache's tiers, fastest first; None when the engine does not report tiers (an engine from before them).
    tiers: tuple[TierStats, ...] | None = None

    @property
    def in_flight_tokens(self) -> int:
        """Used slots outside the tree (running requests' fresh KV)."""
        return max(self.used_tokens - self.evictable_tokens - self.protected_tokens, 0)

    @property
    def used_share(self) -> float:
        return self.used_tokens / self.capacity_tokens if self.capacity_tokens else 0.0


@dataclass(frozen=True)
class CacheTreeSnapshot:
    """The engine's `/v1/cache/tree` answer: one root node dict per namespace, plus whether nodes were cut off."""

    namespaces: list[dict[str, Any]]
    truncated: bool


def _get_json(
    base_url: str, path: str, timeout_s: float, params: dict[str, Any] | None = None, token: str | None = None
) -> Any:
    url = base_url.rstrip("/") + path
    headers = {"authorization": f"Bearer {token}"} if token else None
    try:
        response = httpx.get(url, params=params, timeout=timeout_s, headers=headers)
    except httpx.HTTPError as exc:
        raise EngineUnavailable(f"cannot reach the engine at {base_url}: {exc.__class__.__name__}: {exc}") from exc
    if response.status_code != 200:
        raise EngineUnavailable(f"the engine answered {response.status_code} to GET {path}")
    try:
        return response.json()
    except ValueError as exc:
        raise EngineUnavailable(f"the engine's answer to GET {path} is not JSON") from exc


def _int(payload: dict[str, Any], key: str, where: str = "/v1/cache") -> int:
    return int(_number(payload, key, where))


def _number(payload: dict[str, Any], key: str, where: str = "/v1/cache") -> float:
    value = payload.get(key)
    if value is None:
        return 0
    if isinstance(value, bool):
        raise EngineUnavailable(f"{where} field {key!r} is not a number: {value!r}")
    try:
        return float(value) if isinstance(value, float) else int(value)
    except (TypeError, ValueError) as exc:
        raise EngineUnavailable(f"{where} field {key!r} is not a number: {value!r}") from exc


def tiers_from_payload(payload: dict[str, Any]) -> tuple[TierStats, ...] | None:
    """The `tiers` object of a `/v1/cache` answer, fastest tier first (tiers of other names after, by name); None
    when absent. Raises `EngineUnavailable` when present but malformed."""
    tiers = payload.get("tiers")
    if tiers is None:
        return None
    if not isinstance(tiers, dict) or not all(isinstance(value, dict) for value in tiers.values()):
        raise EngineUnavailable("/v1/cache field 'tiers' is not an object of tier objects")
    names = [name for name in TIER_NAMES if name in tiers] + sorted(set(tiers) - set(TIER_NAMES))
    return tuple(_tier(name, tiers[name]) for name in names)


def _tier(name: str, values: dict[str, Any]) -> TierStats:
    where = f"/v1/cache tiers.{name}"
    counts = {
        key: _int(values, key, where)
        for key in (
            "capacity_tokens",
            "cached_tokens",
            "free_tokens",
            "evictable_tokens",
            "protected_tokens",
            "capacity_bytes",
            "hit_tokens_total",
            "loads_total",
            "load_tokens_total",
            "demoted_tokens_total",
            "dropped_tokens_total",
            "corrupt_files_total",
        )
    }
    load_ms_total = float(_number(values, "load_ms_total", where))
    return TierStats(name=name, enabled=bool(values.get("enabled", False)), load_ms_total=load_ms_total, **counts)


def fetch_cache_stats(base_url: str, timeout_s: float, token: str | None = None) -> CacheStats:
    """`GET {base_url}/v1/cache` (with the engine's admin token, when it has one)."""
    payload = _get_json(base_url, "/v1/cache", timeout_s, token=token)
    if not isinstance(payload, dict):
        raise EngineUnavailable("/v1/cache did not return a JSON object")
    return stats_from_payload(payload)


def stats_from_payload(payload: dict[str, Any]) -> CacheStats:
    """Parse a `/v1/cache` JSON object (engines report either used or free slots)."""
    speed = payload.get("prefill_tokens_per_s")
    try:
        prefill_tokens_per_s = float(speed) if speed is not None else None
    except (TypeError, ValueError):
        prefill_tokens_per_s = None
    if prefill_tokens_per_s is not None and prefill_tokens_per_s <= 0:
        prefill_tokens_per_s = None
    capacity = _int(payload, "capacity_tokens")
    evictable = _int(payload, "evictable_tokens")
    protected = _int(payload, "protected_tokens")
    # Engines report either used or free slots; derive the other.
    if payload.get("used_tokens") is not None:
        used = _int(payload, "used_tokens")
    elif payload.get("free_tokens") is not None:
        used = capacity - _int(payload, "free_tokens")
    else:
        used = evictable + protected
    return CacheStats(
        capacity_tokens=capacity,
        used_tokens=used,
        free_tokens=max(capacity - used, 0),
        evictable_tokens=evictable,
        protected_tokens=protected,
        num_nodes=_int(payload, "num_nodes"),
        evicted_tokens_total=_int(payload, "evicted_tokens_total"),
        expired_tokens_total=_int(payload, "expired_tokens_total"),
        prefill_tokens_per_s=prefill_tokens_per_s,
        raw=payload,
        tiers=tiers_from_payload(payload),
    )


def fetch_cache_tree(base_url: str, max_nodes: int, timeout_s: float, token: str | None = None) -> CacheTreeSnapshot:
    """`GET {base_url}/v1/cache/tree?max_nodes=N` (with the engine's admin token, when it has one)."""
    payload = _get_json(base_url, "/v1/cache/tree", timeout_s, params={"max_nodes": max_nodes}, token=token)
    if not isinstance(payload, dict) or not isinstance(payload.get("namespaces"), list):
        raise EngineUnavailable("/v1/cache/tree did not return an object with a 'namespaces' list")
    namespaces = [ns for ns in payload["namespaces"] if isinstance(ns, dict) and isinstance(ns.get("root"), dict)]
    return CacheTreeSnapshot(namespaces=namespaces, truncated=bool(payload.get("truncated", False)))
