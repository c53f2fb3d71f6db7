"""The answer the gateway returned for a chat request, captured off the client's byte path.

The relays hand over what they already hold, at no cost on the way: the plain response body (`PlainCapture`), the
assistant message of a decoded completion (`MessageCapture`), the streamed bytes as they went to the client
(`StreamCapture`, bounded) or the decoded stream chunks (`ChunkCapture`). Nothing is decoded until the request is
finished and `answer()` is asked for: the first choice's text, its separate reasoning (when the upstream sent one)
and its tool calls, as one `Answer`. An answer past `MAX_ANSWER_CHARS` (or a stream past `MAX_STREAM_BYTES`) is not
kept: its conversation still links, but a rewrite of it cannot be told.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol

import msgspec

MAX_ANSWER_CHARS: Final = 200_000
MAX_STREAM_BYTES: Final = 4 * 1024 * 1024
_DECODER = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of an answer: the function's name and its arguments as the upstream wrote them (JSON text)."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Answer:
    """An assistant answer: `content` ("" when none), `reasoning` (a separate reasoning field, None when absent) and
    the tool calls in order."""

    content: str
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()

    @property
    def chars(self) -> int:
        """Characters held (the memory bound counts these)."""
        return (
            len(self.content)
            + len(self.reasoning or "")
            + sum(len(call.name) + len(call.arguments) for call in self.tool_calls)
        )


class AnswerCapture(Protocol):
    """What a relay leaves on the explain context: the answer, decoded when asked (None: none could be read)."""

    def answer(self) -> Answer | None: ...


def content_text(value: Any) -> str:
    """A message's `content` as text: the string, or its text parts joined ("" for anything else)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        return "".join(p.get("text", "") for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def message_tool_calls(message: dict[str, Any]) -> tuple[ToolCall, ...]:
    """A chat message's tool calls (name and arguments text; "" where one is missing)."""
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            arguments = function.get("arguments")
            calls.append(ToolCall(str(function.get("name") or ""), arguments if isinstance(arguments, str) else ""))
    return tuple(calls)


def _bounded(answer: Answer) -> Answer | None:
    return answer if answer.chars <= MAX_ANSWER_CHARS else None


def answer_of_message(message: Any) -> Answer | None:
    """The `Answer` of a chat completion's assistant `message` (None when it is not an object)."""
    if not isinstance(message, dict):
        return None
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    thought = reasoning if isinstance(reasoning, str) else None
    return _bounded(Answer(content_text(message.get("content")), thought, message_tool_calls(message)))


def answer_of_chunks(chunks: Iterable[Any]) -> Answer | None:
    """The `Answer` assembled from a chat completion stream's chunks (the first choice's deltas)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str]] = {}  # index -> [name, arguments]
    size = 0
    for chunk in chunks:
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if not isinstance(choices, list):
            continue
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            text = delta.get("content")
            if isinstance(text, str):
                content.append(text)
                size += len(text)
            thought = delta.get("reasoning_content", delta.get("reasoning"))
            if isinstance(thought, str):
                reasoning.append(thought)
                size += len(thought)
            for call in delta.get("tool_calls") or ():
                if not isinstance(call, dict):
                    continue
                index = call.get("index")
                held = calls.setdefault(index if isinstance(index, int) else 0, ["", ""])
                function = call.get("function")
                if isinstance(function, dict):
                    name, arguments = function.get("name"), function.get("arguments")
                    if isinstance(name, str):
                        held[0] += name
                    if isinstance(arguments, str):
                        held[1] += arguments
                        size += len(arguments)
        if size > MAX_ANSWER_CHARS:
            return None
    tool_calls = tuple(ToolCall(name, arguments) for _, (name, arguments) in sorted(calls.items()))
    return _bounded(Answer("".join(content), "".join(reasoning) if reasoning else None, tool_calls))


class MessageCapture:
    """A decoded completion's assistant message."""

    __slots__ = ("_message",)

    def __init__(self, message: Any) -> None:
        self._message = message

    def answer(self) -> Answer | None:
        return answer_of_message(self._message)


class PlainCapture:
    """A plain chat completion response body, as sent to the client."""

    __slots__ = ("_body",)

    def __init__(self, body: bytes) -> None:
        self._body = body

    def answer(self) -> Answer | None:
        try:
            payload = _DECODER.decode(self._body)
        except msgspec.DecodeError:
            return None
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        return answer_of_message(choices[0].get("message"))


class ChunkCapture:
    """The decoded chunks of a chat completion stream (kept by reference, bounded in number)."""

    __slots__ = ("_chunks", "overflowed")

    MAX_CHUNKS: Final = 100_000

    def __init__(self) -> None:
        self._chunks: list[Any] = []
        self.overflowed = False

    def add(self, chunk: Any) -> None:
        if len(self._chunks) < self.MAX_CHUNKS:
            self._chunks.append(chunk)
        else:
            self.overflowed = True

    def answer(self) -> Answer | None:
        return None if self.overflowed else answer_of_chunks(self._chunks)


class SentBytes:
    """Bytes as they went to the client, kept up to `MAX_STREAM_BYTES` (past it none are: `overflowed`)."""

    __slots__ = ("_parts", "_size", "overflowed")

    def __init__(self) -> None:
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

    def data(self) -> bytes | None:
        """What was kept (None past the bound)."""
        return None if self.overflowed else b"".join(self._parts)


class StreamCapture(SentBytes):
    """The server-sent-event bytes of a chat completion stream as they went to the client."""

    __slots__ = ()

    def answer(self) -> Answer | None:
        data = self.data()
        return None if data is None else answer_of_chunks(sse_payloads(data))


def sse_payloads(data: bytes) -> Iterable[Any]:
    """The decoded `data:` of each server-sent event in `data` (`[DONE]` and undecodable events skipped)."""
    for event in data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n\n"):
        lines = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        if not lines:
            continue
        payload = b"\n".join(lines)
        if payload == b"[DONE]":
            continue
        try:
            yield _DECODER.decode(payload)
        except msgspec.DecodeError:
            continue
