"""The opt-in `hoist_volatile` rule: move dates, times, timestamps and ids out of the system prompt.

A system prompt that starts with "Current time: 2025-06-01T10:32:07Z" changes on every call, and with it every
cached token after it. This rule replaces each volatile value in the first system (or developer) message with a
numbered placeholder and adds a short system message listing the values, either right after the system prompt
(`after_system`, the default) or at the end of the conversation (`end`, which also keeps earlier turns cacheable).
The long system prefix then stays byte-identical across calls.

Patterns are compiled once, when the tenant's pipeline is built, never per request.
"""

from __future__ import annotations

import re
from typing import Any

from gateway.normalize.base import Request, RuleResult, unchanged

_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?"
    r"|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_WEEKDAY = r"(?:Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat|Sun)(?:day|nesday|urday|sday)?"

# Tried left to right at each position, so longer forms come before the shorter forms they contain.
DEFAULT_VOLATILE_PATTERNS: tuple[str, ...] = (
    # ISO 8601 timestamps: 2025-06-01T10:32:07.123Z, 2025-06-01 10:32+02:00
    r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?",
    # UUIDs
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
    # Dates: 2025-06-01, 06/01/2025, Monday, June 1, 2025, 1 June 2025
    r"\b\d{4}-\d{2}-\d{2}\b",
    r"\b\d{1,2}/\d{1,2}/\d{2,4}\b",
    rf"\b(?:{_WEEKDAY},? )?{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}\b",
    rf"\b(?:{_WEEKDAY},? )?\d{{1,2}}(?:st|nd|rd|th)? {_MONTH}\.?,? \d{{4}}\b",
    # Times: 10:32, 10:32:07, 10:32 PM
    r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s?[AaPp][Mm]\b)?",
    # Long hexadecimal ids (hashes, trace ids) and long numeric ids (epoch seconds, order numbers)
    r"\b[0-9a-fA-F]{16,}\b",
    r"\b\d{8,}\b",
)

NOTE_HEADER = "Current values for the placeholders in the system prompt:"
_PLACEHOLDER_RE = re.compile(r"(\[volatile#\d+\])")
_MAX_ROUNDS = 8


def compile_patterns(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One alternation over all patterns, so a text is scanned once."""
    if not patterns:
        raise ValueError("hoist_volatile needs at least one pattern")
    return re.compile("|".join(f"(?:{p})" for p in patterns))


class HoistVolatile:
    """Replace volatile values in the first system message by placeholders and list them in a short note."""

    name = "hoist_volatile"

    def __init__(self, patterns: tuple[str, ...] = DEFAULT_VOLATILE_PATTERNS, placement: str = "after_system"):
        if placement not in ("after_system", "end"):
            raise ValueError(f"unknown placement {placement!r}")
        self._pattern = compile_patterns(patterns)
        self._placement = placement

    def apply(self, request: Request) -> RuleResult:
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            return unchanged(request)
        first = messages[0]
        if not isinstance(first, dict) or first.get("role") not in ("system", "developer"):
            return unchanged(request)
        values: list[str] = []
        content = first.get("content")
        if isinstance(content, str):
            new_content: Any = self._hoist_text(content, values)
        elif isinstance(content, list):
            new_content = [
                {**part, "text": self._hoist_text(part["text"], values)}
                if isinstance(part, dict) and isinstance(part.get("text"), str)
                else part
                for part in content
            ]
        else:
            return unchanged(request)
        if not values:
            return unchanged(request)
        note = {"role": "system", "content": "\n".join([NOTE_HEADER, *values])}
        new_messages = [{**first, "content": new_content}, *messages[1:]]
        if self._placement == "after_system":
            new_messages.insert(1, note)
        else:
            new_messages.append(note)
        return RuleResult({**request, "messages": new_messages}, True)

    def _hoist_text(self, text: str, values: list[str]) -> str:
        """Replace matches outside existing placeholders until none is left (a fixpoint, hence idempotent)."""

        def replace(match: re.Match[str]) -> str:
            value = match.group(0)
            if not value:
                return value
            values.append(f"[volatile#{len(values) + 1}] {value}")
            return f"[volatile#{len(values)}]"

        for _ in range(_MAX_ROUNDS):
            count_before = len(values)
            pieces = _PLACEHOLDER_RE.split(text)
            # Odd indexes are existing placeholders (the split's capture group); leave them alone.
            text = "".join(p if i % 2 else self._pattern.sub(replace, p) for i, p in enumerate(pieces))
            if len(values) == count_before:
                break
        return text
