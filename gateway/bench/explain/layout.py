"""Where a chat request's parts lie, in the terms a recorded divergence location uses (`docs/engine.md`).

A location is a part (`tools`, `system`, `messages[i]`, `model`) and a character offset inside the part's text:
`tools` is `json.dumps(tool, ensure_ascii=False)` per tool joined by newlines, a message is its text content (text
parts joined), an assistant message's tool calls follow its text after a newline as `<tool_call>{...}</tool_call>`.

To compare two locations the parts are laid end to end in prompt order (tools, system, then the other messages), so
that a location is one character position: the end of one part and the start of the next are the same place (only
template text lies between them, which no request changes).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOOLS = "tools"
SYSTEM = "system"
MODEL = "model"

# One pre-token of a byte-level BPE tokenizer (GPT-2's split, as SmolLM2's tokenizer uses, digits one by one): no
# token crosses its bounds, so the characters of one token at a position are at most those of its pre-token.
_PRE_TOKEN = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[^\W\d_]+| ?\d| ?[^\s\w]+|\s+(?!\S)|\s+")


@dataclass(frozen=True, slots=True)
class Location:
    """A part of the request and a character offset inside its text."""

    segment: str
    char_offset: int


def _tool_call_text(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    return ('<tool_call>{"name": ' + json.dumps(function.get("name")) + ', "arguments": '
            + ("{}" if arguments is None else arguments) + "}</tool_call>")


def message_text(message: dict[str, Any]) -> str:
    """A message's text as the engine locates inside it: its content, then its tool calls (after a newline unless
    the content is empty or ends in whitespace)."""
    content = message.get("content")
    if isinstance(content, list):
        text = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    else:
        text = content or ""
    calls = message.get("tool_calls")
    if message.get("role") == "assistant" and calls:
        separator = "" if not text or text[-1].isspace() else "\n"  # as the engine joins them
        text = text + separator + "\n".join(_tool_call_text(call) for call in calls)
    return text


def parts(body: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The request's parts in prompt order: `(segment, role, text)`; tools first, with role `tools`."""
    found = []
    if body.get("tools"):
        found.append((TOOLS, TOOLS, "\n".join(json.dumps(tool, ensure_ascii=False) for tool in body["tools"])))
    for index, message in enumerate(body.get("messages") or []):
        role = message.get("role", "")
        leading = index == 0 and role in ("system", "developer")
        found.append((SYSTEM if leading else f"messages[{index}]", role, message_text(message)))
    return found


def position(body: dict[str, Any], location: Location) -> int | None:
    """The location as one character position over the parts laid end to end; None when the body has no such part
    or the offset lies beyond it (`model` locations have no position)."""
    at = 0
    for segment, _, text in parts(body):
        if segment == location.segment:
            return at + location.char_offset if 0 <= location.char_offset <= len(text) else None
        at += len(text)
    return None


def start(body: dict[str, Any]) -> Location:
    """The prompt's first character: its first part at offset 0."""
    return Location(parts(body)[0][0], 0)


def first_difference(a: str, b: str) -> int:
    """The index of the first character where `a` and `b` differ (the shorter length when one starts the other)."""
    limit = min(len(a), len(b))
    for index in range(limit):
        if a[index] != b[index]:
            return index
    return limit


def divergence(reference: dict[str, Any], body: dict[str, Any]) -> Location:
    """The first character of `body` that `reference` (what the cache held: an earlier prompt and its answer) did
    not have, part by part: a part of another role, or the first differing character of the first differing part;
    past the reference's last part, the end of that part (the start of what is new)."""
    ours, theirs = parts(body), parts(reference)
    for index, (segment, role, text) in enumerate(ours):
        if index >= len(theirs):
            previous = ours[index - 1] if index else None
            return Location(previous[0], len(previous[2])) if previous else Location(segment, 0)
        other_segment, other_role, other_text = theirs[index]
        if other_segment != segment or other_role != role:
            return Location(segment, 0)
        if other_text != text:
            return Location(segment, first_difference(text, other_text))
    segment, _, text = ours[-1]
    return Location(segment, len(text))


def token_tolerance(body: dict[str, Any], location: Location) -> int:
    """The characters of one token at `location`: the length of the pre-token holding that character (or ending
    there), at least 1."""
    for segment, _, text in parts(body):
        if segment != location.segment:
            continue
        longest = 1
        for match in _PRE_TOKEN.finditer(text):
            if match.start() <= location.char_offset <= match.end():
                longest = max(longest, match.end() - match.start())
            if match.start() > location.char_offset:
                break
        return longest
    return 1


def within_one_token(body: dict[str, Any], truth: Location, recorded: Location | None) -> bool:
    """Whether `recorded` lies within one token of `truth` (the same part for `model`, else the same position over
    the parts laid end to end, give or take the characters of one token)."""
    if recorded is None or recorded.char_offset is None:
        return False
    if truth.segment == MODEL or recorded.segment == MODEL:
        return recorded.segment == truth.segment and abs(recorded.char_offset - truth.char_offset) <= 1
    expected, got = position(body, truth), position(body, recorded)
    if expected is None or got is None:
        return False
    return abs(got - expected) <= token_tolerance(body, truth)
