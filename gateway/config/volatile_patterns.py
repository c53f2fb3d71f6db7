"""The default `volatile_patterns` of a tenant (`hoist_volatile`, see `gateway.normalize.volatile`): dates, times,
timestamps, UUIDs and long ids, as regular expressions; and how a tenant's list is compiled (once, when its pipeline is
built, and when the configuration is read, to refuse a bad pattern at start-up)."""

from __future__ import annotations

import re

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


def compile_patterns(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One alternation over all patterns, so a text is scanned once."""
    if not patterns:
        raise ValueError("hoist_volatile needs at least one pattern")
    return re.compile("|".join(f"(?:{p})" for p in patterns))
