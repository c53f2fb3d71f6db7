"""What every tool-call format provides, and the streaming splitter built on it."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolCall:
    """One call as OpenAI returns it: `arguments` is a JSON-encoded string. `complete` is False when the model's
    JSON was cut short (by `max_tokens`) and completed, so its arguments may miss fields."""

    id: str
    name: str
    arguments: str
    complete: bool = field(default=True, compare=False)

    def as_openai(self, index: int | None = None) -> dict:
        body = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            body = {"index": index, **body}
        return body


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def arguments_json(arguments) -> str:
    """Model-written arguments as OpenAI's JSON object string: objects are serialised, a string that already holds
    a JSON object is kept as written, anything else becomes `{}`."""
    if isinstance(arguments, str):
        try:
            return arguments if isinstance(json.loads(arguments), dict) else "{}"
        except ValueError:
            return "{}"
    return json.dumps(arguments, ensure_ascii=False) if isinstance(arguments, dict) else "{}"


class ToolCallFormat:
    """A model family's tool-call syntax: `open_tag ... close_tag` around one call's body."""

    template_marker: str = ""
    open_tag: str = ""
    close_tag: str = ""

    def opened_json(self, opening: str) -> str:
        """The JSON part of a forced `opening` (the call's body so far), which the model's output completes."""
        return opening[len(self.open_tag):] if opening.startswith(self.open_tag) else ""

    def written_name(self, body: str) -> str | None:
        """The function name a call's body (the text after the open tag) starts by naming, if it does."""
        raise NotImplementedError

    def parse_body(self, body: str, forced_name: str | None) -> ToolCall | None:
        """One call from the text between the tags, or None when it is not a call."""
        raise NotImplementedError

    def body_head(self, function: str) -> str:
        """A call's body up to its arguments (after `open_tag`); the arguments' JSON object follows it."""
        raise NotImplementedError

    body_tail: str = ""  # what closes a call's body after its arguments, before `close_tag`

    def opening(self, function: str | None) -> str:
        """Text that starts the assistant turn to force a call: of `function` up to its arguments (`open_tag` +
        `body_head(function)`), or, when None, up to where the model writes the name of the function it calls."""
        raise NotImplementedError


class ToolCallStream:
    """Splits generated text into content and tool calls as it streams.

    Text that could be the start of `open_tag` is held back until it cannot; a call is emitted once its
    `close_tag` arrives (or at the end of generation). `forced_opening`, the text the prompt already put at the start
    of the answer, is parsed as if generated, and never shown as content.
    """

    def __init__(self, fmt: ToolCallFormat, forced_opening: str = "", forced_name: str | None = None) -> None:
        self._format = fmt
        self._forced_name = forced_name
        self._forced = bool(forced_opening)
        self._buffer = forced_opening
        self._in_call = False
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content to show now, calls completed now)."""
        self._buffer += text
        content, calls = [], []
        while True:
            if self._in_call:
                end = self._buffer.find(self._format.close_tag)
                if end < 0:
                    break
                body, self._buffer = self._buffer[:end], self._buffer[end + len(self._format.close_tag):]
                self._in_call = False
                calls.extend(self._call(body, content))
                continue
            start = self._buffer.find(self._format.open_tag)
            if start >= 0:
                content.append(self._buffer[:start])
                self._buffer = self._buffer[start + len(self._format.open_tag):]
                self._in_call = True
                continue
            keep = _partial_suffix(self._buffer, self._format.open_tag)
            content.append(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            break
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """Whatever is left at the end of generation: an unclosed call is parsed if it is complete JSON."""
        rest, self._buffer = self._buffer, ""
        if not self._in_call:
            return rest, []
        self._in_call = False
        content: list[str] = []
        calls = self._call(rest, content)
        return "".join(content), calls

    def _call(self, body: str, content: list[str]) -> list[ToolCall]:
        forced_name = None
        if not self.calls:
            # A forced call is a call even when its arguments are broken: its name is the one given or, when the
            # model wrote it (constrained to the tools' names), the one it wrote.
            forced_name = self._forced_name or (self._forced and self._format.written_name(body)) or None
        call = self._format.parse_body(body, forced_name)
        if call is None:
            content.append(self._format.open_tag + body)  # not a call after all: show it as the model wrote it
            return []
        self.calls.append(call)
        return [call]


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
