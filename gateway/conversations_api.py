"""`GET /api/conversations` and `GET /api/conversations/{id}`: conversations and their turns from the database,
scoped to what the caller may see (the key in `Authorization: Bearer` or `x-api-key`, as on `/v1/messages`).

The list takes `since` and `until` (as `/api/stats`, but `since` defaults to the last 7 days,
`db.conversation_window.CONVERSATIONS_DEFAULT_SINCE`, as `prefixscope conversations` does), `tenant` and `limit`
(1-1000, default 100; `db.query_params` validates the range and the limit as the CLI does; a parameter given twice
is a 400) and answers `data`, one conversation per object (`db.queries.results_conversations.ConversationSummary`),
worst first (most tokens lost). The detail answers `conversation` (the summary over every turn) and `turns` in time
order, each with its token ledger (`ConversationTurn`); an admin may name the `tenant` when two tenants' ids collide.
Admin keys see every tenant; a tenant key sees only its own: naming another tenant is a 403, and another tenant's
conversation is a 404, as one that does not exist. Counts the upstream did not report are null, never 0.
These endpoints await the database; they are not on the request path.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec
from litestar import Request, Response, get

from db.conversation_window import CONVERSATIONS_DEFAULT_SINCE, CONVERSATIONS_MAX_LIMIT
from gateway.api_params import authorization, readable_tenant, row_limit, short_text, single, time_range
from gateway.auth import KeyStore
from gateway.errors import NotFound, ServiceUnavailable

DEFAULT_LIMIT = 100
ID_MAX_CHARS = 64  # `requests.conversation_id`


class ConversationSource(Protocol):
    async def conversations(self, since: Any, until: Any, tenant: str | None, limit: int) -> list[Any]: ...

    async def conversation(self, conversation_id: str, tenant: str | None) -> Any | None: ...


def make_conversation_handlers(keys: KeyStore, source: ConversationSource) -> list[Any]:
    """The two route handlers, reading through `source` (`gateway.storage.DatabaseStorage` in production)."""

    @get("/api/conversations")
    async def list_conversations(request: Request[Any, Any, Any]) -> Response[bytes]:
        principal = await keys.authenticate_now(authorization(request.headers))
        params = request.query_params
        since, until = time_range(params, CONVERSATIONS_DEFAULT_SINCE)
        tenant = readable_tenant(principal, single(params, "tenant") or None, "conversations")
        limit = row_limit(params, DEFAULT_LIMIT, CONVERSATIONS_MAX_LIMIT)
        rows = await _read(source.conversations(since, until, tenant, limit))
        body = {"since": since, "until": until, "tenant": tenant, "limit": limit, "data": rows}
        return Response(content=msgspec.json.encode(msgspec.to_builtins(body)), media_type="application/json")

    @get("/api/conversations/{conversation_id:str}")
    async def one_conversation(request: Request[Any, Any, Any]) -> Response[bytes]:
        principal = await keys.authenticate_now(authorization(request.headers))
        conversation_id: str = request.path_params["conversation_id"]
        short_text(conversation_id, "conversation_id", ID_MAX_CHARS)
        tenant = readable_tenant(principal, single(request.query_params, "tenant") or None, "conversations")
        found = await _read(source.conversation(conversation_id, tenant))
        if found is None:
            raise NotFound(f"No conversation {conversation_id!r}.", param="conversation_id")
        body = {"conversation": found.summary, "turns": found.turns}
        return Response(content=msgspec.json.encode(msgspec.to_builtins(body)), media_type="application/json")

    return [list_conversations, one_conversation]


async def _read(query: Any) -> Any:
    try:
        return await query
    except Exception as exc:
        raise ServiceUnavailable(f"The database could not be queried: {type(exc).__name__}.") from None
