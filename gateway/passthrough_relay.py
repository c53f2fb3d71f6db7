"""Relaying an upstream that speaks the client's own protocol (`gateway.anthropic.passthrough`,
`gateway.responses.passthrough`): the answer goes back as it came, with the gateway's request id added, and an
`EventStreamReader` subclass reads what the record needs out of the events as their bytes go by.

Events are cut at a blank line (the SSE rule) and each event's `data:` lines are joined and decoded as JSON; events
that are not a JSON object are passed on unread.
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from typing import Any

import httpx
import msgspec

from gateway.asgi_io import Send
from gateway.errors import GatewayError
from gateway.forwarding import map_transport_error
from gateway.recording import RequestTracker
from gateway.request_stages import Answered, Outcome
from gateway.upstreams.route import Route

log = logging.getLogger(__name__)

_DECODER = msgspec.json.Decoder()
_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n")


class EventStreamReader(ABC):
    """Reads a protocol's events as their bytes go by; `answer` makes the request's answered stage of them."""

    def __init__(self) -> None:
        self._buffer = b""
        self.error_type: str | None = None  # set by an error event: the outcome's error type

    @property
    @abstractmethod
    def finished(self) -> bool:
        """The stream said its last word (its final or error event): a broken transport after it is no failure."""

    @abstractmethod
    def answer(self, outcome: Outcome | None) -> Answered: ...

    @abstractmethod
    def read_event(self, payload: dict[str, Any]) -> None:
        """One event's decoded data."""

    def broken_ending(self, error: GatewayError) -> bytes:
        """The last bytes sent when the transport breaks before the stream finished (none by default)."""
        return b""

    def feed(self, chunk: bytes) -> None:
        data = self._buffer + chunk
        position = 0
        for match in _BOUNDARY.finditer(data):
            self._event(data[position : match.start()])
            position = match.end()
        self._buffer = data[position:]

    def _event(self, event: bytes) -> None:
        lines = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
        if not lines:
            return
        try:
            payload = _DECODER.decode(b"\n".join(lines))
        except msgspec.DecodeError:
            return
        if isinstance(payload, dict):
            self.read_event(payload)


def response_headers(
    tracker: RequestTracker, upstream: httpx.Response, id_headers: tuple[bytes, ...] = (b"x-request-id",)
) -> list[tuple[bytes, bytes]]:
    """The gateway's request id under each of `id_headers`, and the upstream's content type unless it streams."""
    request_id = tracker.request_id.encode()
    headers = [(name, request_id) for name in id_headers]
    content_type = upstream.headers.get("content-type")
    if content_type and not content_type.startswith("text/event-stream"):
        headers.append((b"content-type", content_type.encode("latin-1")))
    return headers


async def relay_events(
    upstream: httpx.Response, reader: EventStreamReader, route: Route, send: Send, tracker: RequestTracker
) -> Outcome:
    """Pass the events through as they come; the outcome is fixed (the answered stage set) before the last byte. The
    explain context's answer capture, when it takes bytes (`add`), gets each chunk after it went out."""
    capture = getattr(tracker.explain, "answer", None)
    add = getattr(capture, "add", None)
    try:
        async for chunk in upstream.aiter_raw():
            reader.feed(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if add is not None:
                add(chunk)
    except httpx.HTTPError as exc:
        error = map_transport_error(exc, route)
        log.warning("upstream stream from %s broke: %s", route.name, error.message)
        if not reader.finished and reader.error_type is None:
            outcome = Outcome(error.status_code, error.error_type)
            tracker.answered(reader.answer(outcome))
            await send({"type": "http.response.body", "body": reader.broken_ending(error), "more_body": False})
            return outcome
    outcome = Outcome(upstream.status_code, reader.error_type)
    tracker.answered(reader.answer(outcome))
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return outcome
