"""Cancel a non-streamed request whose client went away.

A streamed response notices a disconnect when a write fails; a non-streamed one writes nothing until the end, so
nobody would notice and the engine would compute the whole answer for no one. While the answer is computed, this
watches the ASGI receive channel, whose next message after the request body is `http.disconnect` once the client
closes the connection (ASGI HTTP spec, "Disconnected - receive event"), and cancels the request at once; the engine
drops it at the start of its next step.
"""

from __future__ import annotations

import asyncio
import contextlib

from local_engine.engine.types import RequestHandle


async def _wait_for_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return


@contextlib.asynccontextmanager
async def cancel_on_disconnect(handle: RequestHandle, receive):
    """Within the block, a client disconnect cancels `handle`. `receive` is the request's ASGI receive callable,
    to be used only after the body has been read."""

    async def watch() -> None:
        await _wait_for_disconnect(receive)
        handle.cancel()

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
