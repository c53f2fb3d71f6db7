"""The Responses API's streaming events, written from OpenAI chat completion chunks.

The sequence (OpenAI's API reference, "Responses: streaming events"; `openai.types.responses.*_event`):
`response.created` and `response.in_progress` (the response, `in_progress`, no output yet); per output item
`response.output_item.added`, then for a message `response.content_part.added`, `response.output_text.delta`...,
`response.output_text.done`, `response.content_part.done`, or for a function call
`response.function_call_arguments.delta`..., `response.function_call_arguments.done`; then
`response.output_item.done`; last `response.completed` (or `response.incomplete`) with the whole response and its
usage. A failure after the stream started ends it with `response.failed`. Every event carries a `sequence_number`
counted from 0, and is sent as `event: TYPE\\ndata: JSON\\n\\n`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from gateway.responses.translate import function_call_item, message_item, new_id

_ENCODER = msgspec.json.Encoder()


class EventWriter:
    """Turns the `choices[0]` deltas of chat chunks into Responses events. One per stream; not thread-safe.

    `response(status, output, usage, incomplete_reason)` builds the Response object the opening and closing events
    carry."""

    def __init__(self, response: Callable[..., dict[str, Any]]) -> None:
        self._response = response
        self._sequence = 0
        self.output: list[dict[str, Any]] = []  # finished items
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._text: list[str] = []
        self._arguments: list[str] = []
        self._tool_index: Any = None
        self.finish_reason: Any = None
        self.saw_content = False

    def event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + _ENCODER.encode(payload) + b"\n\n"

    def start(self) -> bytes:
        opening = self._response("in_progress", [], None)
        return self.event("response.created", response=opening) + self.event("response.in_progress", response=opening)

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """Events for one chat chunk (possibly none)."""
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return b""
        choice = choices[0]
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        out: list[bytes] = []
        text = delta.get("content")
        if isinstance(text, str) and text:
            self.saw_content = True
            if self._open is None or self._open["type"] != "message":
                out.append(self._close())
                out.append(self._open_message())
            self._text.append(text)
            out.append(self._item_event("response.output_text.delta", content_index=0, delta=text, logprobs=[]))
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            self.saw_content = True
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            index = call.get("index", 0)
            if self._open is None or self._open["type"] != "function_call" or index != self._tool_index:
                out.append(self._close())
                out.append(self._open_call(call))
                self._tool_index = index
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                self._arguments.append(arguments)
                out.append(self._item_event("response.function_call_arguments.delta", delta=arguments))
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        return b"".join(out)

    def finish(self, status: str, usage: dict[str, Any], incomplete_reason: str | None) -> tuple[bytes, dict[str, Any]]:
        """The closing events, and the final Response object they carry."""
        closing = self._close(status)  # an incomplete response: its last item is the one the limit cut short
        final = self._response(status, self.output, usage, incomplete_reason)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return closing + self.event(kind, response=final), final

    def fail(self, message: str, code: str) -> bytes:
        """`response.failed` after an upstream failure mid-stream (the open item is closed as incomplete)."""
        closing = self._close(status="incomplete")
        failed = {**self._response("failed", self.output, None), "error": {"code": code, "message": message}}
        return closing + self.event("response.failed", response=failed)

    # -- items -----------------------------------------------------------------------------------------------------

    def _item_event(self, kind: str, **data: Any) -> bytes:
        assert self._open is not None
        return self.event(kind, item_id=self._open["id"], output_index=len(self.output), **data)

    def _open_message(self) -> bytes:
        item = self._open = {**message_item("", new_id("msg"), "in_progress"), "content": []}
        self._text = []
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        added = self.event("response.output_item.added", output_index=len(self.output), item=item)
        return added + self._item_event("response.content_part.added", content_index=0, part=part)

    def _open_call(self, call: dict[str, Any]) -> bytes:
        item = self._open = {**function_call_item(call, new_id("fc"), "in_progress"), "arguments": ""}
        self._arguments = []
        return self.event("response.output_item.added", output_index=len(self.output), item=item)

    def _close(self, status: str = "completed") -> bytes:
        item = self._open
        if item is None:
            return b""
        out: list[bytes] = []
        if item["type"] == "message":
            text = "".join(self._text)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            out.append(self._item_event("response.output_text.done", content_index=0, text=text, logprobs=[]))
            out.append(self._item_event("response.content_part.done", content_index=0, part=part))
            done = {**item, "status": status, "content": [part]}
        else:
            arguments = "".join(self._arguments)
            out.append(self._item_event("response.function_call_arguments.done", arguments=arguments))
            done = {**item, "status": status, "arguments": arguments}
        out.append(self.event("response.output_item.done", output_index=len(self.output), item=done))
        self.output.append(done)
        self._open = None
        return b"".join(out)
