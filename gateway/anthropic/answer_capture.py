"""The answer of an `anthropic` upstream (passthrough), captured for the conversation tracker (`gateway.conversations`).

The relay hands over the bytes it sent the client (the message body, or the stream's events, bounded); once the
request is finished they are read back into the message's content blocks and translated as the next turn's re-sent
assistant message will be (`translate.to_chat_body`, with the tenant's `ChatStyle`), so that the answer and its
re-sent copy are compared in the same form.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from gateway.anthropic.translate import ChatStyle, to_chat_body
from gateway.conversations.answer import MAX_STREAM_BYTES, Answer, answer_of_message

_DECODER = msgspec.json.Decoder()


class MessageAnswerCapture:
    """The bytes of one Messages API answer as sent (a JSON message or server-sent events)."""

    __slots__ = ("_style", "_parts", "_size", "overflowed")

    def __init__(self, style: ChatStyle) -> None:
        self._style = style
        self._parts: list[bytes] = []
        self._size = 0
        self.overflowed = False

    def add(self, data: bytes) -> None:
        if self.overflowed or not data:
            return
        self._size += len(data)
        if self._size > MAX_STREAM_BYTES:
            self.overflowed, self._parts = True, []
            return
        self._parts.append(data)

    def answer(self) -> Answer | None:
        if self.overflowed or not self._parts:
            return None
        data = b"".join(self._parts)
        if data.lstrip().startswith(b"{"):
            try:
                message = _DECODER.decode(data)
            except msgspec.DecodeError:
                return None
            blocks = message.get("content") if isinstance(message, dict) else None
        else:
            blocks = _streamed_blocks(data)
        if not isinstance(blocks, list):
            return None
        blocks = [b for b in blocks if isinstance(b, dict) and b.get("type") in ("text", "tool_use")]
        body = {"model": "", "messages": [{"role": "assistant", "content": blocks}]}
        try:
            return answer_of_message(to_chat_body(body, stream=False, style=self._style)["messages"][-1])
        except (KeyError, TypeError, ValueError):
            return None


def _streamed_blocks(data: bytes) -> list[dict[str, Any]]:
    """The content blocks of a streamed message, from its `content_block_start` and `content_block_delta` events."""
    blocks: dict[int, dict[str, Any]] = {}
    arguments: dict[int, list[str]] = {}
    for event in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
        try:
            payload = _DECODER.decode(b"\n".join(lines)) if lines else None
        except msgspec.DecodeError:
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("index"), int):
            continue
        index, kind = payload["index"], payload.get("type")
        if kind == "content_block_start" and isinstance(payload.get("content_block"), dict):
            blocks[index] = dict(payload["content_block"])
        elif kind == "content_block_delta" and index in blocks and isinstance(payload.get("delta"), dict):
            delta = payload["delta"]
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                blocks[index]["text"] = blocks[index].get("text", "") + delta["text"]
            elif delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                arguments.setdefault(index, []).append(delta["partial_json"])
    for index, parts in arguments.items():
        try:
            blocks[index]["input"] = json.loads("".join(parts) or "{}")
        except ValueError:
            blocks[index]["input"] = {}
    return [blocks[index] for index in sorted(blocks)]
