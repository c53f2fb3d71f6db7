"""Why a request body could not be used, named by field: the error path of `gateway.parsing`.

msgspec refuses lone UTF-16 surrogates and gives up past ~1000 levels of nesting; the client still deserves to know
which field was at fault. These helpers run only once decoding failed (or a rule overflowed the stack), so the hot
path pays nothing for them.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.errors import BadRequest

MAX_DEPTH = 64


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


class _OutOfRange:
    """Stands for a number no program could take (thousands of digits, or beyond a double's range)."""


OUT_OF_RANGE = _OutOfRange()


def _int(text: str) -> int | _OutOfRange:
    return int(text) if len(text) <= 4000 else OUT_OF_RANGE


def _float(text: str) -> float | _OutOfRange:
    value = float(text)
    return OUT_OF_RANGE if value in (float("inf"), float("-inf")) else value


def undecodable_body(raw: bytes, reason: str) -> BadRequest:
    """The 400 for a body msgspec could not decode: naming the field when Python's decoder can read it."""
    try:
        body = json.loads(raw, parse_constant=_no_constants, parse_int=_int, parse_float=_float)
    except RecursionError:
        return BadRequest(f"The request body nests JSON deeper than {MAX_DEPTH} levels.", param=_deep_key(raw))
    except (ValueError, UnicodeDecodeError):
        return BadRequest(f"We could not parse the JSON body of your request: {reason}")
    if isinstance(body, dict):
        found = first_unusable(body)
        if found is not None:
            path, why = found
            return BadRequest(f"{path}: {why}", param=path)
    return BadRequest(f"We could not parse the JSON body of your request: {reason}")


def first_unusable(value: Any, path: str = "") -> tuple[str, str] | None:
    """(path, why) of the first string that is not valid Unicode or number out of any range, or None. Paths read
    `messages[0].content`."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if item is OUT_OF_RANGE:
            return where, "the number is out of range."
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where, "the string holds a lone UTF-16 surrogate and cannot be encoded."
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                child_path = f"{where}.{key}" if where else str(key)
                stack.append((child, child_path))
                stack.append((key, where))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in reversed(list(enumerate(item))))
    return None


def too_deep_field(body: dict[str, Any], limit: int = MAX_DEPTH) -> str | None:
    """The first top-level field nested deeper than `limit` levels (walked without recursion)."""
    for key, value in body.items():
        stack = [(value, 1)]
        while stack:
            item, depth = stack.pop()
            if depth > limit:
                return str(key)
            if isinstance(item, dict):
                stack.extend((child, depth + 1) for child in item.values())
            elif isinstance(item, list):
                stack.extend((child, depth + 1) for child in item)
    return None


def too_deep(body: dict[str, Any]) -> BadRequest:
    return BadRequest(f"The request nests JSON deeper than {MAX_DEPTH} levels.", param=too_deep_field(body))


def _deep_key(raw: bytes) -> str | None:
    """The top-level key under which the raw JSON nests deepest (a byte scan that skips strings)."""
    depth, deepest, deepest_key, key = 0, 0, None, None
    in_string, escaped, string_start, string_is_key, last = False, False, 0, False, 0
    for index, byte in enumerate(raw):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # closing quote
                in_string = False
                if string_is_key:
                    key = raw[string_start:index].decode("utf-8", "replace")
                last = byte
            continue
        if byte in b" \t\r\n":
            continue
        if byte == 0x22:
            in_string, string_start = True, index + 1
            string_is_key = depth == 1 and last in (0x7B, 0x2C)  # after `{` or `,`
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > deepest:
                deepest, deepest_key = depth, key
        elif byte in (0x5D, 0x7D):
            depth -= 1
        last = byte
    return deepest_key
