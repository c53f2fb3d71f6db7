"""A request as ordered segments, each with a stable hash: what the gateway compares to explain a miss.

A chat request becomes `model`, `tools` (when it has any), `system` (a leading system or developer message) and one
`messages[i]` per other message, in that order (`i` is the index in the request's `messages`). A completions request
becomes `model` and `prompt`. Each segment's `digest` hashes its JSON exactly as sent (key order kept, since a chat
template renders it that way), so equal digests mean equal prompt bytes for that part. Its `text` is what a character
offset refers to: the message content when the message is plain text, else the segment's compact JSON.

Two cheaper-to-skip comparisons are computed only when a segment differs (`unordered_digest`, `shape_digest`): the
same content in another key or tool order, and the same text with its volatile values (dates, ids, numbers) masked.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.normalize.volatile import DEFAULT_VOLATILE_PATTERNS

MODEL = "model"
TOOLS = "tools"
SYSTEM = "system"
MESSAGE = "message"
PROMPT = "prompt"

_ENCODER = msgspec.json.Encoder()  # keeps key order
_TURN_ROLES = frozenset({"user", "tool", "function"})
_INSTRUCTION_ROLES = frozenset({"system", "developer"})
# Fields whose string value is often JSON text: a tool call's `arguments`, a message's (tool result's) `content`.
_JSON_STRINGS = frozenset({"arguments", "content"})
_KIND_TAGS = {MODEL: b"m", TOOLS: b"t", SYSTEM: b"s", MESSAGE: b"u", PROMPT: b"p"}
_MONTHS = r"January|February|March|April|May|June|July|August|September|October|November|December"
_WEEKDAYS = r"Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"
# The hoisting rule's patterns (longest forms first), then names of days and months, then any number.
_VOLATILE = re.compile("|".join(f"(?:{p})" for p in DEFAULT_VOLATILE_PATTERNS) + rf"|\b(?:{_MONTHS}|{_WEEKDAYS})\b|\d+")


def digest_bytes(data: bytes) -> int:
    """A non-negative 63-bit hash (fits a signed 64-bit column)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1


@dataclass(frozen=True, slots=True)
class Segment:
    """One part of a request: `name` as recorded (`tools`, `messages[3]`), `kind` (model/tools/system/message/prompt),
    the exact `digest`, and the `text` that character offsets refer to."""

    name: str
    kind: str
    digest: int
    text: str


@dataclass(frozen=True, slots=True)
class PromptSegments:
    """A request's segments in prompt order. `turn_start` is the index of the first segment of the final turn (the
    trailing user and tool messages: what is new in this call); `len(segments)` when there is no such turn."""

    segments: tuple[Segment, ...]
    turn_start: int

    @property
    def digests(self) -> tuple[int, ...]:
        return tuple(segment.digest for segment in self.segments)


def _segment(name: str, kind: str, value: Any, text: str | None = None) -> Segment:
    try:
        encoded = _ENCODER.encode(value)
    except (TypeError, msgspec.EncodeError):
        encoded = repr(value).encode("utf-8", "surrogatepass")
    if text is None:
        text = encoded.decode("utf-8", "replace")
    return Segment(name, kind, digest_bytes(_KIND_TAGS[kind] + encoded), text)


def _message_text(message: dict[str, Any]) -> str | None:
    """The content of a plain `{role, content}` text message (the part a template renders as is), else None."""
    content = message.get("content")
    if isinstance(content, str) and len(message) == 2:
        return content
    return None


def chat_segments(body: dict[str, Any]) -> PromptSegments:
    """Segments of a chat completions body (validated by the parser: `messages` is a non-empty list of objects)."""
    segments = [_segment(MODEL, MODEL, body.get("model"), str(body.get("model")))]
    tools = body.get("tools")
    if tools:
        segments.append(_segment(TOOLS, TOOLS, tools))
    messages = body.get("messages") or []
    turn_start = len(messages)
    while (
        turn_start > 0
        and isinstance(messages[turn_start - 1], dict)
        and (messages[turn_start - 1].get("role") in _TURN_ROLES)
    ):
        turn_start -= 1
    turn_start = min(turn_start, len(messages) - 1) if messages else 0
    first_message_segment = len(segments)
    for index, message in enumerate(messages):
        is_system = index == 0 and isinstance(message, dict) and message.get("role") in _INSTRUCTION_ROLES
        name, kind = (SYSTEM, SYSTEM) if is_system else (f"messages[{index}]", MESSAGE)
        text = _message_text(message) if isinstance(message, dict) else None
        segments.append(_segment(name, kind, message, text))
    return PromptSegments(tuple(segments), first_message_segment + turn_start)


def completion_segments(body: dict[str, Any]) -> PromptSegments:
    """Segments of a completions body: the model and the prompt (a batch of one counts as its prompt)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    segments = (
        _segment(MODEL, MODEL, body.get("model"), str(body.get("model"))),
        _segment(PROMPT, PROMPT, prompt, prompt if isinstance(prompt, str) else None),
    )
    return PromptSegments(segments, len(segments))


def first_difference(a: str, b: str) -> int:
    """The index of the first character where `a` and `b` differ (the shorter length when one starts the other)."""
    limit = min(len(a), len(b))
    if a[:limit] == b[:limit]:
        return limit
    low, high = 0, limit  # a[:low] == b[:low] and a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle
    return low


def common_suffix(a: str, b: str) -> int:
    """How many trailing characters `a` and `b` share."""
    limit = min(len(a), len(b))
    if limit == 0 or a[len(a) - limit :] == b[len(b) - limit :]:
        return limit
    low, high = 0, limit  # the last `low` characters agree, the last `high` do not
    while high - low > 1:
        middle = (low + high) // 2
        if a[len(a) - middle :] == b[len(b) - middle :]:
            low = middle
        else:
            high = middle
    return low


def shape_digest(text: str) -> int:
    """The digest of `text` with dates, times, ids, numbers and day or month names masked."""
    return digest_bytes(_VOLATILE.sub("\x00", text).encode("utf-8", "surrogatepass"))


def _sorted_value(value: Any) -> Any:
    """`value` with object keys sorted, JSON held in strings (tool-call arguments, a tool result's content) canonical
    and a tool list in a canonical order."""
    if isinstance(value, dict):
        items = {}
        for key in sorted(value, key=str):
            item = value[key]
            if key in _JSON_STRINGS and isinstance(item, str) and item.lstrip()[:1] in ("{", "["):
                try:
                    item = json.loads(item)
                except (ValueError, RecursionError):
                    pass
            items[key] = _sorted_value(item)
        return items
    if isinstance(value, list):
        return [_sorted_value(item) for item in value]
    return value


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def unordered_digest(kind: str, text: str) -> int | None:
    """The digest of a JSON segment's text ignoring key order (and, for tools, the order of the tools); None when the
    text is not JSON (plain message text has no order to ignore)."""
    if kind == MODEL or text[:1] not in ("{", "["):
        return None
    try:
        value = _sorted_value(json.loads(text))
    except (ValueError, RecursionError):
        return None
    if kind == TOOLS and isinstance(value, list):
        canonical = "\n".join(sorted(_canonical_json(tool) for tool in value))
    else:
        canonical = _canonical_json(value)
    return digest_bytes(canonical.encode("utf-8", "surrogatepass"))


def segment_names(segments: Sequence[Segment]) -> tuple[str, ...]:
    return tuple(segment.name for segment in segments)
