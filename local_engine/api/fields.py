"""Typed reads of request-body fields: an explicit `null` means "absent", anything else of the wrong type, out of
range or not encodable is an `InvalidRequest` naming the field (`param`), never a 500.

The JSON body itself is decoded strictly: `NaN`/`Infinity` literals, numbers beyond any range (integers of
thousands of digits, `1e400`), nesting deeper than the decoder's recursion limit and invalid UTF-8 are 400s.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from local_engine.errors import InvalidRequest

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_SMALLEST_NORMAL = sys.float_info.min  # 2.2250738585072014e-308
_MAX_DEPTH = 64


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


class _OutOfRange:
    """Stands for a number no field could take (thousands of digits, or beyond a double's range)."""


_OUT_OF_RANGE = _OutOfRange()


def _int(text: str) -> int | _OutOfRange:
    return int(text) if len(text) <= 4000 else _OUT_OF_RANGE


def _float(text: str) -> float | _OutOfRange:
    value = float(text)
    return _OUT_OF_RANGE if value in (float("inf"), float("-inf")) else value


def parse_json_body(raw: bytes) -> dict:
    """`raw` (UTF-8 JSON) -> the body object. Raises `InvalidRequest` for anything that is not a JSON object."""
    try:
        body = json.loads(raw, parse_constant=_no_constants, parse_int=_int, parse_float=_float)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # huge integers, NaN, too deep
        raise InvalidRequest(f"the request body is not valid JSON: {type(exc).__name__}: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    problem = find_unusable_value(body)
    if problem is not None:
        path, why = problem
        raise InvalidRequest(f"{path or 'the request body'}: {why}", param=path or None)
    return body


def find_unusable_value(value: Any, path: str = "", depth: int = 0) -> tuple[str, str] | None:
    """The first (path, reason) of a value no field could ever accept: a string with a lone surrogate (cannot be
    encoded as UTF-8), a subnormal float, a number out of any range, or nesting deeper than 64 levels. Paths read
    `messages[0].content`."""
    if value is _OUT_OF_RANGE:
        return path, "the number is out of range"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path, "the string holds a lone UTF-16 surrogate and cannot be encoded"
        return None
    if isinstance(value, float):
        if value != 0.0 and abs(value) < _SMALLEST_NORMAL:
            return path, "subnormal numbers are not accepted"
        return None
    if depth > _MAX_DEPTH and isinstance(value, (dict, list)):
        return path, f"nested deeper than {_MAX_DEPTH} levels"
    if isinstance(value, dict):
        for key, item in value.items():
            child = f"{path}.{key}" if path else str(key)
            problem = find_unusable_value(key, child, depth + 1) or find_unusable_value(item, child, depth + 1)
            if problem is not None:
                if problem[0] == child and not _encodable(key):
                    return path, "an object key holds a lone UTF-16 surrogate"
                return problem
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problem = find_unusable_value(item, f"{path}[{index}]", depth + 1)
            if problem is not None:
                return problem
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def optional_bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be a boolean", param=name)
    return value


def optional_int(body: dict, name: str, low: int, high: int) -> int | None:
    """An integer in [low, high], or None when absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be an integer in [{low}, {high}]", param=name)
    return value


def optional_number(body: dict, name: str, default: float, low: float, high: float) -> float:
    """A number in [low, high] as a float, or `default` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be a number between {low} and {high}", param=name)
    return float(value)


def optional_str(body: dict, name: str, max_chars: int = 1_000_000) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_chars:
        raise InvalidRequest(f"{name} must be a string of at most {max_chars} characters", param=name)
    return value


def optional_object(body: dict, name: str) -> dict | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{name} must be an object", param=name)
    return value


def optional_choice(body: dict, name: str, choices: tuple[str, ...]) -> str | None:
    """One of `choices`, or None when absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or value not in choices:
        shown = repr(value)[:100]
        raise InvalidRequest(f"{name} must be one of {', '.join(choices)}; got {shown}", param=name)
    return value


def stop_strings(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) and s for s in stop):
        return tuple(stop)
    raise InvalidRequest("stop must be a non-empty string or a list of at most 4 non-empty strings", param="stop")


def check_ignored_fields(body: dict) -> None:
    """OpenAI fields this engine accepts and does not act on: their types are still checked."""
    for name, kind in (("user", str), ("metadata", dict), ("store", bool), ("parallel_tool_calls", bool),
                       ("service_tier", str)):
        value = body.get(name)
        if value is not None and not isinstance(value, kind):
            raise InvalidRequest(f"{name} must be a {kind.__name__}", param=name)
