"""Server-sent-events relay: forwards upstream events as they complete and reads usage from them.

Upstream bytes are cut at event boundaries (a blank line). Each complete event is forwarded at once; only a
partial event at the end of a network chunk waits for the rest of itself. The relay looks inside events only
while it needs something: the first content-bearing chunk (for time to first token) and any chunk that carries a
usage object. When the gateway asked for usage on the client's behalf (`stream_options.include_usage`), the
usage-only chunk is consumed here and not forwarded. The engine puts its `prefix_cache` object (with the prompt's
hash chain, when the gateway asked for it) on that same chunk; the relay keeps it and forwards the chunk without
the hash chain unless the client asked for one.
"""

from __future__ import annotations

import re
import time
from typing import Any

import msgspec

from gateway.explain.chains import strip_hash_chain
from gateway.telemetry.response_facts import ResponseFacts
from gateway.upstreams.base import UpstreamAdapter, UsageReport

_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()
_USAGE_OBJECT = re.compile(rb'"(?:usage|meta_info)"\s*:\s*\{')
_ERROR_KEY = re.compile(rb'"error"\s*:')
_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
# `"usage": null` on every chunk is what an upstream sends when usage was asked for; the gateway asks on the client's
# behalf, so for a client that did not ask, the member goes (OpenAI sends it only to clients that ask). Quotes
# inside JSON strings are escaped, so this matches only an object member.
_NULL_USAGE = re.compile(rb',\s*"usage"\s*:\s*null(?=\s*[,}])|"usage"\s*:\s*null\s*,\s*')


class SSERelay:
    """Stateful filter over one upstream stream. Not thread-safe; one per request."""

    def __init__(
        self, adapter: UpstreamAdapter, *, forward_usage: bool, start_perf: float, forward_hash_chain: bool = True
    ) -> None:
        self._adapter = adapter
        self._forward_usage = forward_usage
        self._forward_hash_chain = forward_hash_chain
        self._start_perf = start_perf
        self._buffer = b""
        self.usage: UsageReport | None = None
        self.prefix_cache: dict[str, Any] | None = None
        self.ttft_ms: float | None = None
        self.error_type: str | None = None
        self.saw_done = False
        self.response = ResponseFacts()  # id, model and finish reasons, for the request's span

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to forward now for this upstream network chunk (possibly empty)."""
        data = self._buffer + chunk if self._buffer else chunk
        if b"\r" in data:
            return self._feed_slow(data)
        end = data.rfind(b"\n\n")
        if end < 0:
            self._buffer = data
            return b""
        complete, self._buffer = data[: end + 2], data[end + 2 :]
        if not self._forward_usage and b'"usage"' in complete:
            complete = _NULL_USAGE.sub(b"", complete)
        if self.ttft_ms is not None and not _USAGE_OBJECT.search(complete) and not _ERROR_KEY.search(complete):
            # Fast path: nothing in these events needs a look.
            if b"data: [DONE]" in complete:
                self.saw_done = True
            self.response.scan_finish_reasons(complete)
            return complete
        out = [self._event(event) for event in complete[:-2].split(b"\n\n")]
        return b"".join(out)

    def flush(self) -> bytes:
        """Whatever is left when the upstream closes (an unterminated last event is forwarded as is)."""
        rest, self._buffer = self._buffer, b""
        if not self._forward_usage and b'"usage"' in rest:
            rest = _NULL_USAGE.sub(b"", rest)
        if rest.strip():
            return self._event(rest.rstrip(b"\r\n"))
        return rest

    def _feed_slow(self, data: bytes) -> bytes:
        if not self._forward_usage and b'"usage"' in data:
            data = _NULL_USAGE.sub(b"", data)
        out = []
        position = 0
        for match in _BOUNDARY.finditer(data):
            out.append(self._event(data[position : match.start()]))
            position = match.end()
        self._buffer = data[position:]
        return b"".join(out)

    def _event(self, event: bytes) -> bytes:
        """Inspect one event (without its terminating blank line); return what to forward."""
        payload = _data_of(event)
        if payload is None:
            return event + b"\n\n"
        if payload == b"[DONE]":
            self.saw_done = True
            return event + b"\n\n"
        needs_usage = _USAGE_OBJECT.search(payload) is not None
        needs_error = _ERROR_KEY.search(payload) is not None
        if self.ttft_ms is not None and not needs_usage and not needs_error:
            self.response.scan_finish_reasons(payload)
            return event + b"\n\n"
        try:
            chunk = _DECODER.decode(payload)
        except msgspec.DecodeError:
            return event + b"\n\n"
        if not isinstance(chunk, dict):
            return event + b"\n\n"
        self.response.read_body(chunk.get("id"), chunk.get("model"), chunk.get("choices"))
        if self.ttft_ms is None and _has_content(chunk):
            self.ttft_ms = (time.perf_counter() - self._start_perf) * 1000.0
        if needs_error and isinstance(chunk.get("error"), dict):
            error = chunk["error"]
            self.error_type = str(error.get("type") or error.get("code") or "upstream_error")
        if needs_usage and self._adapter.has_usage(chunk):
            self.usage = self._adapter.usage(chunk)
            prefix_cache = chunk.get("prefix_cache")
            if isinstance(prefix_cache, dict):
                self.prefix_cache = prefix_cache
            if not self._forward_usage:
                if not chunk.get("choices"):
                    return b""  # the usage-only chunk the client did not ask for
                stripped = {k: v for k, v in chunk.items() if k != "usage"}
                return b"data: " + _ENCODER.encode(self._shown(stripped)) + b"\n\n"
            shown = self._shown(chunk)
            if shown is not chunk:
                return b"data: " + _ENCODER.encode(shown) + b"\n\n"
        return event + b"\n\n"

    def _shown(self, chunk: dict[str, Any]) -> dict[str, Any]:
        """The chunk as the client sees it: without the hash chain the gateway asked for on its own behalf."""
        return chunk if self._forward_hash_chain else strip_hash_chain(chunk)


def _data_of(event: bytes) -> bytes | None:
    """The joined `data:` field of an event, or None for comments and events without data."""
    if event.startswith(b"data: ") and b"\n" not in event:
        return event[6:]
    lines = [line for line in event.splitlines() if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[5:].removeprefix(b" ") for line in lines)


def _has_content(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content")
        ):
            return True
        if choice.get("finish_reason"):
            return True  # an empty completion: its first token is the stop
    return False
