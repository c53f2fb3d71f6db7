"""A minimal, fast OpenAI-compatible upstream for benchmarks: raw asyncio HTTP/1.1, answers at once.

It parses just enough HTTP (request line, Content-Length, keep-alive) to answer `/v1/chat/completions`,
`/v1/completions` (plain or streamed), `/v1/models` and `/health` with canned bodies, so that what a benchmark
measures is the gateway, not the upstream.

Run: `python -m gateway.bench.stub --port 9001`.
"""

from __future__ import annotations

import argparse
import asyncio
import json

_USAGE = {
    "prompt_tokens": 512,
    "completion_tokens": 8,
    "total_tokens": 520,
    "prompt_tokens_details": {"cached_tokens": 448},
}
_CHAT = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": _USAGE,
    }
).encode()
_STREAM_EVENTS = (
    b"".join(
        b"data: " + json.dumps(chunk).encode() + b"\n\n"
        for chunk in (
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            },
            {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "ok"}}]},
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            },
            {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": _USAGE},
        )
    )
    + b"data: [DONE]\n\n"
)
_MODELS = json.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]}).encode()
_CACHE_HEADERS = (
    b"x-prefix-cache-matched-tokens: 448\r\nx-prefix-cache-prompt-tokens: 512\r\nx-prefix-cache-miss: partial\r\n"
)


def _response(body: bytes, content_type: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n"
        + _CACHE_HEADERS
        + b"\r\n"
        + body
    )


_PLAIN = _response(_CHAT, b"application/json")
_STREAMED = _response(_STREAM_EVENTS, b"text/event-stream")
_MODELS_RESPONSE = _response(_MODELS, b"application/json")
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


class StubProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            head_end = self._buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self._buffer[:head_end]
            length = 0
            lower = head.lower()
            index = lower.find(b"content-length:")
            if index >= 0:
                line_end = lower.find(b"\r\n", index)
                length = int(lower[index + 15 : line_end if line_end >= 0 else None])
            total = head_end + 4 + length
            if len(self._buffer) < total:
                return
            body = self._buffer[head_end + 4 : total]
            self._buffer = self._buffer[total:]
            self._answer(head, body)

    def _answer(self, head: bytes, body: bytes) -> None:
        assert self._transport is not None
        path = head.split(b" ", 2)[1]
        if path.endswith(b"/completions"):
            streamed = b'"stream":true' in body or b'"stream": true' in body
            self._transport.write(_STREAMED if streamed else _PLAIN)
        elif path.endswith(b"/models") or path == b"/health":
            self._transport.write(_MODELS_RESPONSE)
        else:
            self._transport.write(_NOT_FOUND)


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(StubProtocol, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    from gateway.bench.loadgen import run_fast

    run_fast(serve(args.host, args.port))


if __name__ == "__main__":
    main()
