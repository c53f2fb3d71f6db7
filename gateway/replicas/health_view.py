"""The replica part of the gateway's `/health` answer."""

from __future__ import annotations

from typing import Any

from gateway.replicas.dispatch import HasReplicaSets


def replica_health(router: HasReplicaSets, upstream: str) -> dict[str, Any]:
    """`{"routing": policy, "replicas": [...]}` for a replica set, `{}` for a plain upstream."""
    replica_set = router.replica_sets.get(upstream)
    if replica_set is None:
        return {}
    return {"routing": replica_set.policy, "failovers": replica_set.failovers, "replicas": replica_set.describe()}


def upstreams_without_replicas(router: HasReplicaSets) -> list[str]:
    """The replica sets none of whose replicas is in rotation (each failed its health check), by name."""
    sets = router.replica_sets.items()
    return sorted(name for name, replica_set in sets if not any(r.healthy for r in replica_set.replicas))
