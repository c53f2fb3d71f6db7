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
from gateway.conversations.answer import Answer, SentBytes, answer_of_message, sse_payloads

_DECODER = msgspec.json.Decoder()


class MessageAnswerCapture(SentBytes):
    """The bytes of one Messages API answer as sent (a JSON message or server-sent events)."""

    __slots__ = ("_style",)

    def __init__(self, style: ChatStyle) -> None:
        super().__init__()
        self._style = style

    def answer(self) -> Answer | None:
        data = self.data()
        if not data:
            return None
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
    for payload in sse_payloads(data):
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
