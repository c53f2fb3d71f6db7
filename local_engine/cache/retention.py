"""How a retention class becomes a node's lifetime, and how the lifetimes of several requests combine.

A node carries `ttl_s` (idle seconds before it expires in every tier; None: never by TTL) and `persistent` (exempt
from TTL and evicted after the non-persistent nodes of its tier). The longest class that stored or used a node wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from local_engine.cache.tiers import RETENTION_TTL_S, retention_rank


@dataclass(frozen=True, slots=True)
class Lifetime:
    ttl_s: float | None  # idle seconds; None never expires
    persistent: bool = False

    @property
    def label(self) -> str:
        """The retention class name stored in disk headers ("default" when the engine's `--ttl` applied)."""
        if self.persistent:
            return "persistent"
        for name, ttl_s in RETENTION_TTL_S.items():
            if ttl_s is not None and ttl_s == self.ttl_s:
                return name
        return "default"


def lifetime_of(retention: str | None, default_ttl_s: float | None) -> Lifetime:
    """The lifetime a request with `retention` ("5m" | "1h" | "persistent" | None) gives the nodes it touches.

    Raises ValueError for an unknown class."""
    if retention is None:
        return Lifetime(default_ttl_s)
    retention_rank(retention)
    if retention == "persistent":
        return Lifetime(None, persistent=True)
    return Lifetime(RETENTION_TTL_S[retention])


def extend(node, lifetime: Lifetime) -> None:
    """Give `node` the longer of its lifetime and `lifetime` (persistent wins; no TTL beats any TTL)."""
    node.persistent = node.persistent or lifetime.persistent
    if node.persistent or node.ttl_s is None or lifetime.ttl_s is None:
        node.ttl_s = None
    else:
        node.ttl_s = max(node.ttl_s, lifetime.ttl_s)


def is_expired(node, now_s: float) -> bool:
    return not node.persistent and node.ttl_s is not None and node.last_access_s <= now_s - node.ttl_s
