"""Small raw-ASGI helpers for the hot path: bounded body reads, responses, and cancel-on-disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from contextlib import suppress
from typing import Any, TypeVar

from gateway.errors import ClientDisconnected, PayloadTooLarge

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

T = TypeVar("T")

JSON_CONTENT_TYPE = (b"content-type", b"application/json")
# The response headers of a server-sent-events stream (no proxy buffering, no caching).
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def header_values(scope: dict[str, Any], *names: bytes) -> dict[bytes, str]:
    """The first value of each wanted request header (names lower case), decoded as latin-1."""
    wanted = set(names)
    found: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name in wanted and name not in found:
            found[name] = value.decode("latin-1")
    return found


async def read_body(receive: Receive, limit_bytes: int, content_length: str | None) -> bytes:
    """The whole request body, refusing (413) before reading when Content-Length is over the limit, and while
    reading when a chunked body grows past it."""
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            declared = 0
        if declared > limit_bytes:
            raise PayloadTooLarge(f"The request body ({declared} bytes) is over the limit of {limit_bytes} bytes.")
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientDisconnected("client disconnected while sending the request")
    body = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit_bytes:
            raise PayloadTooLarge(f"The request body is over the limit of {limit_bytes} bytes.")
        return body
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected("client disconnected while sending the request")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            raise PayloadTooLarge(f"The request body is over the limit of {limit_bytes} bytes.")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def send_response(send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]]) -> None:
    all_headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(work: Coroutine[Any, Any, T], receive: Receive) -> T:
    """Run `work`; if the client disconnects first, cancel it (closing the upstream request) and raise
    `ClientDisconnected`. Must be called after the request body has been read."""
    work_task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait((work_task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work_task.cancel()
        watcher.cancel()
        raise
    if work_task.done():
        watcher.cancel()
        return work_task.result()
    work_task.cancel()
    with suppress(asyncio.CancelledError, Exception):
        await work_task
    raise ClientDisconnected("client disconnected before the response was complete")
