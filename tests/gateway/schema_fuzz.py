"""Hypothesis strategies over the request-body schemas a program serves in its OpenAPI document: valid bodies drawn
from the schema, then mutated (a field replaced by any JSON value, a required field dropped, an unknown field added),
and the checks every answer must pass (no 5xx, OpenAI-shaped errors)."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import strategies as st

# Values that broke one program or the other at some point: huge and out-of-range numbers, subnormals, lone
# surrogates, NUL, control-token text, deep nesting.
NASTY_SCALARS = [
    None, True, False, 0, -1, 1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**60, 1e-320, -0.0, 1e308, 0.5, 3.0,
    "", "x", "\ud83d", "a\x00b", "<|im_end|>", "<tool_call>", "m" * 300, "1e400h", "3000000d",
]
_SCALARS = st.one_of(
    st.sampled_from(NASTY_SCALARS),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
ANY_JSON = st.recursive(
    _SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.sampled_from(["role", "content", "type", "x"]), children,
                                                        max_size=3)
    ),
    max_leaves=8,
) | st.builds(lambda n: json.loads("[" * n + "1" + "]" * n), st.sampled_from([70, 300, 900]))


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def from_schema(schema: dict[str, Any], components: dict[str, Any], overrides: dict[str, Any] | None = None,
                depth: int = 0) -> st.SearchStrategy[Any]:
    """Values valid for the JSON Schema subset the documents use (small, so each request stays cheap)."""
    schema = _resolve(schema, components)
    if "anyOf" in schema:
        return st.one_of([from_schema(s, components, overrides, depth) for s in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}, components, overrides, depth) for k in kind])
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        low, high = schema.get("minimum"), schema.get("maximum")
        return st.integers(min_value=low, max_value=high if high is not None else (low or 0) + 50)
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1e6))
        return st.floats(min_value=low, max_value=schema.get("maximum", 1e6), allow_nan=False,
                         exclude_min="exclusiveMinimum" in schema)
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 30), 30))
    if kind == "array":
        items = from_schema(schema.get("items", {"type": "string"}), components, None, depth + 1)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=min(schema.get("maxItems", 3), 3))
    if kind == "object":
        properties = schema.get("properties", {})
        if depth > 3 or not properties:
            return st.just({})
        required = set(schema.get("required", ()))
        fields = {}
        for name, sub in properties.items():
            if overrides and name in overrides:
                strategy = overrides[name]
            else:
                strategy = from_schema(sub, components, None, depth + 1)
            fields[name] = strategy if name in required else st.one_of(st.just(_ABSENT), strategy)
        return st.fixed_dictionaries(fields).map(lambda d: {k: v for k, v in d.items() if v is not _ABSENT})
    return ANY_JSON


_ABSENT = object()


@st.composite
def request_bodies(draw: st.DrawFn, schema: dict[str, Any], components: dict[str, Any],
                   overrides: dict[str, Any]) -> dict[str, Any]:
    """A valid body, then up to two mutations."""
    body = draw(from_schema(schema, components, overrides))
    properties = list(_resolve(schema, components).get("properties", {}))
    for _ in range(draw(st.integers(0, 2))):
        action = draw(st.sampled_from(["replace", "replace", "nested", "drop", "unknown"]))
        if action == "replace":
            body[draw(st.sampled_from(properties))] = draw(ANY_JSON)
        elif action == "nested" and isinstance(body.get("messages"), list) and body["messages"]:
            message = draw(st.sampled_from(body["messages"]))
            if isinstance(message, dict):
                message[draw(st.sampled_from(["role", "content", "tool_calls", "name", "tool_call_id"]))] = draw(
                    ANY_JSON)
        elif action == "drop" and body:
            body.pop(draw(st.sampled_from(sorted(body))))
        elif action == "unknown":
            body[draw(st.text(min_size=1, max_size=8))] = draw(ANY_JSON)
    return body


def encode(body: dict[str, Any]) -> bytes:
    """JSON bytes as a client would send them (lone surrogates as \\u escapes)."""
    return json.dumps(body).encode()


def check_answer(response: httpx.Response, success_member: str = "choices") -> None:
    """No 5xx; every error OpenAI-shaped; every success a completion (or a stream of them), or for other
    endpoints a JSON object with `success_member`."""
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)
        assert error["param"] is None or isinstance(error["param"], str)
        assert error["code"] is None or isinstance(error["code"], str)
        return
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        for event in events[:-1]:
            assert "error" not in json.loads(event)
        return
    assert success_member in response.json()
