"""A minimal, fast OpenAI-compatible upstream for benchmarks: raw asyncio HTTP/1.1, answers at once.

It parses just enough HTTP (request line, Content-Length, keep-alive) to answer `/v1/chat/completions`,
`/v1/completions` (plain or streamed), `/v1/cache/match`, `/v1/models` and `/health` with canned bodies, so that what
a benchmark measures is the gateway, not the upstream. It also takes OTLP/HTTP span exports (`POST /v1/traces`) for
the traced run of `bench gateway --tracing`. Like the local engine, its answers carry the `prefix_cache`
object with a block hash chain (which the gateway records and removes from what the client sees).

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
_REPORT = {"matched_tokens": 448, "prompt_tokens": 512, "miss": "partial"}
_CHAIN = {"block_size": 16, "input_length": 512, "hash_ids": [(i * 2654435761) % 2**62 for i in range(32)]}


def _chat_body(prefix_cache: dict) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": "bench",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": _USAGE,
            "prefix_cache": prefix_cache,
        }
    ).encode()


def _stream_events(prefix_cache: dict) -> bytes:
    chunks = (
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "ok"}}]},
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": _USAGE, "prefix_cache": prefix_cache},
    )
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"


_MATCH = json.dumps({"matched_tokens": 64, "prompt_tokens": 512, "miss": "partial"}).encode()
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


# With the block hash chain when the request asked for it (`return_hash_chain`), as the engine answers.
_PLAIN = _response(_chat_body(_REPORT), b"application/json")
_PLAIN_CHAINED = _response(_chat_body({**_REPORT, "hash_chain": _CHAIN}), b"application/json")
_STREAMED = _response(_stream_events(_REPORT), b"text/event-stream")
_STREAMED_CHAINED = _response(_stream_events({**_REPORT, "hash_chain": _CHAIN}), b"text/event-stream")
_MODELS_RESPONSE = _response(_MODELS, b"application/json")
_MATCH_RESPONSE = _response(_MATCH, b"application/json")
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
# An OTLP/HTTP collector's answer to `POST /v1/traces`: an empty ExportTraceServiceResponse (all spans accepted).
_TRACES_ACCEPTED = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"


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
        if path.endswith(b"/cache/match"):
            self._transport.write(_MATCH_RESPONSE)
        elif path.endswith(b"/completions"):
            streamed = b'"stream":true' in body or b'"stream": true' in body
            chained = b'"return_hash_chain":true' in body or b'"return_hash_chain": true' in body
            if streamed:
                self._transport.write(_STREAMED_CHAINED if chained else _STREAMED)
            else:
                self._transport.write(_PLAIN_CHAINED if chained else _PLAIN)
        elif path.endswith(b"/models") or path == b"/health":
            self._transport.write(_MODELS_RESPONSE)
        elif path == b"/v1/traces":
            self._transport.write(_TRACES_ACCEPTED)
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
