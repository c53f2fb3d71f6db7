"""The semantics-preserving normalization rules, applied to a Responses body in its own shape (for OpenAI upstreams,
which get the body as Responses; chat upstreams get the translated chat body through the tenant's chat pipeline).

The same rule names as for chat requests (and the tenant's same switches): `newlines` (CRLF/CR and BOMs in the
instructions, input text and function call outputs; assistant messages, the answers re-sent, are left as they are),
`tool_schema_key_order` (keys of every tool definition sorted recursively) and `tool_order` (tools sorted by type and
name). `tool_call_arguments_key_order` changes nothing in this shape: a `function_call` item re-sent as the upstream
returned it is what the upstream cached, and the gateway does not capture those answers to write a re-serialised
one back. Rules that move content (`hoist_volatile`) are not applied here. The input is never mutated; a changed
part is a fresh copy.
"""

from __future__ import annotations

from typing import Any

from gateway.normalize.rules import ToolSchemaKeyOrder, normalize_newlines
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
    if not isinstance(item, dict) or item.get("role") == "assistant":
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


def normalize(body: dict[str, Any], settings: TenantSettings) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The normalized body and the names of the rules that changed it, in the chat pipeline's order."""
    applied: list[str] = []
    steps = (
        ("newlines", _newlines),
        ("tool_schema_key_order", lambda b: _TOOL_SCHEMA_KEY_ORDER.apply(b).request),
        ("tool_order", _tool_order),
    )
    for name, rule in steps:
        if name in settings.rules:
            new = rule(body)
            if new is not body:
                applied.append(name)
                body = new
    return body, tuple(applied)
