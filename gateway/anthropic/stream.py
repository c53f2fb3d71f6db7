"""Anthropic's streaming events, written from OpenAI chat completion chunks.

The sequence (Anthropic's API reference, "Streaming messages"): `message_start` (the message with empty content and
the prompt-side usage), `ping`, then per content block `content_block_start`, `content_block_delta` (`text_delta`
or `input_json_delta`) and `content_block_stop`, then `message_delta` (`stop_reason`, `stop_sequence` and the final
usage), `message_stop`. A failure after the stream started ends it with an `error` event. Each event is
`event: NAME\\ndata: JSON\\n\\n`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.anthropic.translate import matched_stop_of, stop_reason

_ENCODER = msgspec.json.Encoder()


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _ENCODER.encode(data) + b"\n\n"


def message_start(message_id: str, model: str, usage: dict[str, Any]) -> bytes:
    message = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    return event("message_start", {"type": "message_start", "message": message}) + event("ping", {"type": "ping"})


def error_event(message: str, error_type: str = "api_error") -> bytes:
    return event("error", {"type": "error", "error": {"type": error_type, "message": message}})


class ChunkTranslator:
    """Turns the `choices[0]` deltas of OpenAI chunks into content block events. Not thread-safe; one per stream."""

    def __init__(self, stop_sequences: Any) -> None:
        self._stop_sequences = stop_sequences
        self._index = -1
        self._open: str | None = None  # "text" or "tool_use"
        self._tool_index: Any = None  # the OpenAI tool call index of the open tool_use block
        self.finish_reason: Any = None
        self.matched_stop: Any = None
        self.saw_content = False

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """Events for one chunk (possibly none)."""
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return b""
        choice = choices[0]
        out = []
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        text = delta.get("content")
        if isinstance(text, str) and text:
            self.saw_content = True
            if self._open != "text":
                out.append(self._start({"type": "text", "text": ""}, "text"))
            out.append(self._delta({"type": "text_delta", "text": text}))
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            self.saw_content = True
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            index = call.get("index", 0)
            if self._open != "tool_use" or index != self._tool_index:
                block = {
                    "type": "tool_use",
                    "id": str(call.get("id") or ""),
                    "name": str(function.get("name") or ""),
                    "input": {},
                }
                out.append(self._start(block, "tool_use"))
                self._tool_index = index
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                out.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
            self.matched_stop = matched_stop_of(choice)
        return b"".join(out)

    def finish(self, usage: dict[str, Any]) -> bytes:
        """The closing events: the open block's stop, `message_delta` with `usage`, `message_stop`."""
        reason, sequence = stop_reason(self.finish_reason, self.matched_stop, self._stop_sequences)
        out = [self._stop()] if self._open is not None else []
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage}
        out.append(event("message_delta", delta))
        out.append(event("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def _start(self, block: dict[str, Any], kind: str) -> bytes:
        out = self._stop() if self._open is not None else b""
        self._index += 1
        self._open = kind
        start = {"type": "content_block_start", "index": self._index, "content_block": block}
        return out + event("content_block_start", start)

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def _stop(self) -> bytes:
        self._open = None
        return event("content_block_stop", {"type": "content_block_stop", "index": self._index})
