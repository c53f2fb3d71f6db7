"""How groups are named in grouped figures (`stats --by`, the stats API, the dashboard's tables)."""

from __future__ import annotations

from typing import Final

from db.records import UNAUTHENTICATED_TENANT

# The group name shown for requests rejected before routing (bad input, auth failures): the gateway records them
# with an empty model and upstream, which would otherwise form a blank group, and those refused before a key named a
# tenant under the reserved tenant name `UNAUTHENTICATED_TENANT`.
REJECTED_GROUP: Final = "(rejected)"


def group_label(name: str | None, group_by: str | None = None) -> str | None:
    """`name`, or `REJECTED_GROUP` for the empty model or upstream of requests that never reached an upstream and,
    grouped by tenant, for the requests refused before a key named a tenant."""
    if name == "" or (group_by == "tenant" and name == UNAUTHENTICATED_TENANT):
        return REJECTED_GROUP
    return name
