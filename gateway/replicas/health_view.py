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
