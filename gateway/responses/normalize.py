"""The semantics-preserving normalization rules, applied to a Responses body in its own shape (for OpenAI upstreams,
which get the body as Responses; chat upstreams get the translated chat body through the tenant's chat pipeline).

The same rule names as for chat requests (and the tenant's same switches): `newlines` (CRLF/CR and BOMs in the
instructions, input text and function call outputs), `tool_schema_key_order` (keys of every tool definition sorted
recursively), `tool_order` (tools sorted by type and name) and `tool_call_arguments_key_order` (the arguments of
every `function_call` item re-serialized with sorted keys). Rules that move content (`hoist_volatile`) are not
applied here. The input is never mutated; a changed part is a fresh copy.
"""

from __future__ import annotations

from typing import Any

from gateway.normalize.rules import ToolSchemaKeyOrder, canonical_json_text, normalize_newlines
from gateway.config.tenant import TenantSettings

_TOOL_SCHEMA_KEY_ORDER = ToolSchemaKeyOrder()


def _text(value: Any) -> Any:
    """Normalized text of a string or a list of content parts (the same object when unchanged)."""
    if isinstance(value, str):
        text = normalize_newlines(value)
        return value if text == value else text
    if isinstance(value, list):
        parts = [
            {**part, "text": normalize_newlines(part["text"])}
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else part
            for part in value
        ]
        return value if all(new == old for new, old in zip(parts, value, strict=True)) else parts
    return value


def _item_newlines(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    for field in ("content", "output"):
        if field in item:
            text = _text(item[field])
            if text is not item[field]:
                return {**item, field: text}
    return item


def _newlines(body: dict[str, Any]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    instructions = _text(body.get("instructions"))
    if isinstance(instructions, str) and instructions is not body.get("instructions"):
        changes["instructions"] = instructions
    value = body.get("input")
    if isinstance(value, str):
        text = _text(value)
        if text is not value:
            changes["input"] = text
    elif isinstance(value, list):
        items = [_item_newlines(item) for item in value]
        if any(new is not old for new, old in zip(items, value, strict=True)):
            changes["input"] = items
    return {**body, **changes} if changes else body


def _tool_key(tool: Any) -> tuple[str, str]:
    if not isinstance(tool, dict):
        return ("~", "")
    name = tool.get("name")
    return (str(tool.get("type", "")), name if isinstance(name, str) else "")


def _tool_order(body: dict[str, Any]) -> dict[str, Any]:
    tools = body.get("tools")
    if not isinstance(tools, list) or len(tools) < 2:
        return body
    keys = [_tool_key(tool) for tool in tools]
    if all(keys[i] <= keys[i + 1] for i in range(len(keys) - 1)):
        return body
    order = sorted(range(len(tools)), key=keys.__getitem__)
    return {**body, "tools": [tools[i] for i in order]}


def _arguments(body: dict[str, Any]) -> dict[str, Any]:
    value = body.get("input")
    if not isinstance(value, list):
        return body
    items = list(value)
    changed = False
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "function_call" and isinstance(item.get("arguments"), str):
            canonical = canonical_json_text(item["arguments"])
            if canonical is not None and canonical != item["arguments"]:
                items[index] = {**item, "arguments": canonical}
                changed = True
    return {**body, "input": items} if changed else body


def normalize(body: dict[str, Any], settings: TenantSettings) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The normalized body and the names of the rules that changed it, in the chat pipeline's order."""
    applied: list[str] = []
    steps = (
        ("newlines", _newlines),
        ("tool_schema_key_order", lambda b: _TOOL_SCHEMA_KEY_ORDER.apply(b).request),
        ("tool_order", _tool_order),
        ("tool_call_arguments_key_order", _arguments),
    )
    for name, rule in steps:
        if name in settings.rules:
            new = rule(body)
            if new is not body:
                applied.append(name)
                body = new
    return body, tuple(applied)
