"""The ASGI plumbing the scriptable upstream stubs share (`anthropic_stub`, `responses_stub`): lifespan, reading a
request's body, answering with JSON or with server-sent events. A stub says what to answer in `answer`."""

from __future__ import annotations

import json
from typing import Any


def sse_event(name: str, data: dict[str, Any]) -> bytes:
    """One server-sent event: its `event:` name and its data as JSON."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


class AsgiStub:
    """An ASGI app that completes lifespan and hands each request's scope and whole body to `answer`."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await self.answer(scope, b"".join(chunks), send)

    async def answer(self, scope: dict[str, Any], body: bytes, send: Any) -> None:
        raise NotImplementedError

    @staticmethod
    async def send_json(send: Any, status: int, obj: Any) -> None:
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
        )
        await send({"type": "http.response.body", "body": json.dumps(obj).encode(), "more_body": False})

    @staticmethod
    async def send_events(send: Any, events: list[bytes]) -> None:
        """A 200 event stream of `events`, each sent as its own body chunk."""
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
