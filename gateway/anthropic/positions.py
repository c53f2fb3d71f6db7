"""Breakpoint positions in tokens, measured by the engine's dry-run match (`POST /v1/cache/match`).

Each cut request (the request up to a breakpoint) and the whole request are sent with `return_hash_chain` and a block
size of one token, so each answer carries a chained hash per token: the number of equal leading hashes is the common
token prefix (see `gateway.anthropic.accounting`). A dry run reads the cache and changes nothing, so these calls run
while the upstream works on the request itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import httpx
import msgspec

from gateway.anthropic.accounting import CachePoint, common_prefix
from gateway.anthropic.request import Breakpoint
from gateway.anthropic.translate import ChatStyle, cut_chat_body
from gateway.upstreams.route import Route

log = logging.getLogger(__name__)

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


class DryRunFailed(Exception):
    """The engine's dry-run match did not answer usably: `transport` is the connection failure, `status` the engine's
    non-200 status, `upstream_message` and `upstream_code` its error's message and code, when there were some."""

    def __init__(
        self,
        message: str,
        *,
        transport: httpx.HTTPError | None = None,
        status: int | None = None,
        upstream_message: str | None = None,
        upstream_code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.transport = transport
        self.status = status
        self.upstream_message = upstream_message
        self.upstream_code = upstream_code


def _error_field(content: bytes, name: str) -> str | None:
    """The OpenAI-shaped error body's `error.<name>` when it is a string."""
    try:
        body = _DECODER.decode(content)
    except msgspec.DecodeError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    value = error.get(name) if isinstance(error, dict) else None
    return value if isinstance(value, str) else None


async def dry_run(
    client: httpx.AsyncClient, route: Route, chat_body: dict[str, Any], salt: str, *, chain: bool
) -> dict:
    """The engine's dry-run answer (`prompt_tokens`, `matched_tokens`, `miss`, and `hash_chain` when `chain`)."""
    body = {"model": chat_body["model"], "messages": chat_body["messages"], "cache_salt": salt}
    if chat_body.get("tools"):
        body["tools"] = chat_body["tools"]
    if chain:
        body["return_hash_chain"] = True
        body["hash_block_size"] = 1
    request = httpx.Request(
        "POST", route.match_url, headers=route.headers, content=_ENCODER.encode(body), extensions=route.extensions
    )
    try:
        response = await client.send(request)
        content = await response.aread()
    except httpx.HTTPError as exc:
        raise DryRunFailed(f"{type(exc).__name__}: {exc}", transport=exc) from None
    if response.status_code != 200:
        raise DryRunFailed(
            f"HTTP {response.status_code}: {content[:200]!r}",
            status=response.status_code,
            upstream_message=_error_field(content, "message"),
            upstream_code=_error_field(content, "code"),
        )
    try:
        answer = _DECODER.decode(content)
    except msgspec.DecodeError as exc:
        raise DryRunFailed(str(exc)) from None
    if not isinstance(answer, dict) or not isinstance(answer.get("prompt_tokens"), int):
        raise DryRunFailed("the dry-run answer has no prompt_tokens")
    return answer


def _hash_ids(answer: dict) -> list[int]:
    chain = answer.get("hash_chain")
    ids = chain.get("hash_ids") if isinstance(chain, dict) else None
    if not isinstance(ids, list):
        raise DryRunFailed("the dry-run answer has no hash chain")
    return ids


async def breakpoint_positions(
    client: httpx.AsyncClient,
    route: Route,
    anthropic_body: dict[str, Any],
    chat_body: dict[str, Any],
    breakpoints: Sequence[Breakpoint],
    salt: str,
    style: ChatStyle,
) -> list[CachePoint]:
    """Each breakpoint's position in the prompt of `chat_body` (the translation of `anthropic_body`); raises
    `DryRunFailed` when the engine cannot say."""
    calls = [dry_run(client, route, chat_body, salt, chain=True)]
    calls += [dry_run(client, route, cut_chat_body(anthropic_body, bp, style), salt, chain=True) for bp in breakpoints]
    answers = await asyncio.gather(*calls)
    full = _hash_ids(answers[0])
    return [CachePoint(common_prefix(full, _hash_ids(a)), bp.ttl) for bp, a in zip(breakpoints, answers[1:])]
