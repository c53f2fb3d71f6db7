"""Flatten the engine's cache-tree snapshot into the parallel lists a plotly icicle/treemap/sunburst takes.

Each node's `num_tokens` is the length of its own edge, so the figure uses `branchvalues="remainder"`: a box's size is
its own tokens plus its descendants'. A synthetic top node holds all namespaces so the chart has a single root.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ROOT_ID = "cache"


@dataclass
class FlatTree:
    """Columns for plotly; index i of every list describes the same node."""

    ids: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    subtree_tokens: list[int] = field(default_factory=list)
    hit_counts: list[int] = field(default_factory=list)
    locked: list[bool] = field(default_factory=list)
    # Seconds since the node was last used, as the engine reports it.
    last_access_s: list[float | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class NamespaceSummary:
    namespace: str
    tenant: str | None
    num_nodes: int
    num_tokens: int
    hit_count: int
    num_locked: int


def _as_int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def flatten_tree(
    namespaces: list[dict[str, Any]], tenants: Mapping[str, str] | None = None
) -> tuple[FlatTree, list[NamespaceSummary]]:
    """Walk every namespace's tree (iteratively: trees can be deep) into a `FlatTree` and per-namespace totals.
    `tenants` maps namespace labels to tenant names (from the database); a namespace found there is labelled with
    its tenant."""
    tenants = tenants or {}
    flat = FlatTree()
    summaries: list[NamespaceSummary] = []
    flat.ids.append(ROOT_ID)
    flat.parents.append("")
    flat.labels.append("cache")
    flat.num_tokens.append(0)
    flat.subtree_tokens.append(0)
    flat.hit_counts.append(0)
    flat.locked.append(False)
    flat.last_access_s.append(None)

    for ns_index, entry in enumerate(namespaces):
        namespace = str(entry.get("namespace", f"ns{ns_index}"))
        ns_prefix = f"{ns_index}:{namespace}"
        ns_start = len(flat)
        # Depth-first with an explicit stack of (node, parent id); post-order sums fill subtree_tokens afterwards.
        stack: list[tuple[dict[str, Any], str, bool]] = [(entry["root"], ROOT_ID, True)]
        children_of: dict[int, list[int]] = {}
        position_of_id: dict[str, int] = {}
        while stack:
            node, parent_id, is_root = stack.pop()
            node_id = f"{ns_prefix}/{node.get('id', len(flat))}"
            position = len(flat)
            position_of_id[node_id] = position
            if parent_id in position_of_id:
                children_of.setdefault(position_of_id[parent_id], []).append(position)
            tokens = _as_int(node.get("num_tokens"))
            hits = _as_int(node.get("hit_count"))
            flat.ids.append(node_id)
            flat.parents.append(parent_id)
            root_label = f"tenant {tenants[namespace]}" if namespace in tenants else f"ns {namespace}"
            flat.labels.append(root_label if is_root else f"{tokens} tok · {hits} hits")
            flat.num_tokens.append(tokens)
            flat.subtree_tokens.append(tokens)
            flat.hit_counts.append(hits)
            flat.locked.append(bool(node.get("locked", False)))
            access = node.get("last_access_s")
            flat.last_access_s.append(float(access) if isinstance(access, int | float) else None)
            for child in reversed(node.get("children") or []):
                if isinstance(child, dict):
                    stack.append((child, node_id, False))
        # Children always come after their parent in pre-order, so a reverse sweep accumulates subtree sizes.
        for position in range(len(flat) - 1, ns_start - 1, -1):
            for child_position in children_of.get(position, []):
                flat.subtree_tokens[position] += flat.subtree_tokens[child_position]
        summaries.append(
            NamespaceSummary(
                namespace=namespace,
                tenant=tenants.get(namespace),
                num_nodes=len(flat) - ns_start,
                num_tokens=sum(flat.num_tokens[ns_start:]),
                hit_count=sum(flat.hit_counts[ns_start:]),
                num_locked=sum(flat.locked[ns_start:]),
            )
        )
    flat.subtree_tokens[0] = sum(s.num_tokens for s in summaries)
    return flat, summaries
