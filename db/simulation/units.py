"""Parsing and printing the simulator's settings: cache sizes in tokens (`100k`, `1M`, `inf`) and TTLs (`5m`, `none`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from db.timeutil import parse_duration

T = TypeVar("T")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)\s*$", re.IGNORECASE)
# Decimal multiples, as token counts are usually quoted (a "1M-token cache").
_SIZE_FACTORS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_UNLIMITED = ("inf", "unlimited")
_NO_TTL = ("none", "off", "never")


def parse_size(text: str) -> int | None:
    """Tokens: `100k` = 100,000, `1M`, `2.5M`, `10G`, a plain number; `inf` or `unlimited` gives None."""
    if text.strip().lower() in _UNLIMITED:
        return None
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"not a cache size: {text!r} (expected e.g. 100k, 1M, 10M or inf)")
    return int(float(match.group(1)) * _SIZE_FACTORS[match.group(2).lower()])


def parse_ttl(text: str) -> float | None:
    """Seconds: `30s`, `5m`, `1h`, `7d`, a plain number of seconds; `none` (or `off`) gives None, no expiry."""
    stripped = text.strip().lower()
    if stripped in _NO_TTL:
        return None
    try:
        return float(stripped)
    except ValueError:
        pass
    try:
        return parse_duration(stripped).total_seconds()
    except ValueError:
        raise ValueError(f"not a TTL: {text!r} (expected none or a duration such as 90s, 5m, 1h)") from None


def parse_list(text: str, parse: Callable[[str], T]) -> list[T]:
    """A comma-separated list, each item parsed by `parse`; an empty list is an error."""
    items = [item for item in (part.strip() for part in text.split(",")) if item]
    if not items:
        raise ValueError(f"expected a comma-separated list, got {text!r}")
    return [parse(item) for item in items]


def format_size(tokens: int | None) -> str:
    """`100k`, `1M`, `1.5M`, `inf`: the inverse of `parse_size` for round figures."""
    if tokens is None:
        return "inf"
    for suffix, factor in (("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if tokens >= factor and tokens % (factor // 100) == 0:
            return f"{tokens / factor:g}{suffix}"
    return str(tokens)


def format_ttl(ttl_s: float | None) -> str:
    """`none`, `90s`, `5m`, `1h`, `2d`: the largest unit that divides the TTL evenly."""
    if ttl_s is None:
        return "none"
    for suffix, unit in (("d", 86400), ("h", 3600), ("m", 60)):
        if ttl_s >= unit and ttl_s % unit == 0:
            return f"{ttl_s / unit:g}{suffix}"
    return f"{ttl_s:g}s"
