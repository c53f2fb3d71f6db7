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

from gateway.config.tenant import HOIST_PLACEMENTS
from gateway.config.volatile_patterns import DEFAULT_VOLATILE_PATTERNS, compile_patterns
from gateway.normalize.base import Request, RuleResult, unchanged

NOTE_HEADER = "Current values for the placeholders in the system prompt:"
_PLACEHOLDER_RE = re.compile(r"(\[volatile#\d+\])")
_MAX_ROUNDS = 8


class HoistVolatile:
    """Replace volatile values in the first system message by placeholders and list them in a short note."""

    name = "hoist_volatile"

    def __init__(self, patterns: tuple[str, ...] = DEFAULT_VOLATILE_PATTERNS, placement: str = "after_system"):
        if placement not in HOIST_PLACEMENTS:
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
