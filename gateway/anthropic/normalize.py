"""The semantics-preserving normalization rules, applied to a Messages body in Anthropic's own shape.

The same rule names as for chat requests (and the tenant's same switches): `newlines` (CRLF/CR and BOMs in system,
user message and tool result text; assistant messages, the answers re-sent, are left as they are),
`tool_schema_key_order` (keys of every tool definition sorted recursively) and `tool_order` (tools sorted by name).
`tool_call_arguments_key_order` changes nothing in this shape: a `tool_use` re-sent as returned is what the upstream
cached, and sorting its input would miss there; on a chat upstream the handler writes the translated calls back as
the gateway returned them (`gateway.normalize.rules.ToolCallArgumentsKeyOrder`).
None of them moves content across a `cache_control` breakpoint: tools are sorted only within the runs a tool
breakpoint closes, and the breakpoint stays on the last tool of its run. Rules that move content (`hoist_volatile`)
are not applied to Messages requests.

Every function is pure: the input is never mutated; a changed part is a fresh copy.
"""

from __future__ import annotations

from typing import Any

from gateway.config.tenant import TenantSettings
from gateway.normalize.rules import ToolSchemaKeyOrder, normalize_newlines

_TOOL_SCHEMA_KEY_ORDER = ToolSchemaKeyOrder()


def _text_blocks(blocks: list[Any]) -> list[Any]:
    out = blocks
    for index, block in enumerate(blocks):
        if not isinstance(block, dict):
            continue
        new = block
        if isinstance(block.get("text"), str):
            text = normalize_newlines(block["text"])
            if text != block["text"]:
                new = {**block, "text": text}
        if block.get("type") == "tool_result":
            content = _content(block.get("content"))
            if content is not block.get("content"):
                new = {**new, "content": content}
        if new is not block:
            if out is blocks:
                out = list(blocks)
            out[index] = new
    return out


def _content(content: Any) -> Any:
    if isinstance(content, str):
        text = normalize_newlines(content)
        return content if text == content else text
    if isinstance(content, list):
        return _text_blocks(content)
    return content


def newlines(body: dict[str, Any]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    system = _content(body.get("system"))
    if system is not body.get("system"):
        changes["system"] = system
    messages = body["messages"]
    new_messages = [
        m if m.get("role") == "assistant" or (c := _content(m.get("content"))) is m.get("content")
        else {**m, "content": c}
        for m in messages
    ]
    if any(new is not old for new, old in zip(new_messages, messages)):
        changes["messages"] = new_messages
    return {**body, **changes} if changes else body


def tool_order(body: dict[str, Any]) -> dict[str, Any]:
    """Sort tools by name within each run that ends at a tool breakpoint (or at the end of the list)."""
    tools = body.get("tools")
    if not isinstance(tools, list) or len(tools) < 2:
        return body
    ordered: list[Any] = []
    run: list[Any] = []
    for tool in tools:
        run.append(tool)
        if tool.get("cache_control") is not None:
            ordered += _sorted_run(run)
            run = []
    ordered += _sorted_run(run)
    if all(a is b for a, b in zip(ordered, tools)):
        return body
    return {**body, "tools": ordered}


def _sorted_run(run: list[Any]) -> list[Any]:
    if len(run) < 2:
        return run
    names = [tool.get("name", "") for tool in run]
    if names == sorted(names):
        return run
    mark = run[-1].get("cache_control")
    bare = [
        {k: v for k, v in tool.items() if k != "cache_control"} if tool is run[-1] and mark else tool for tool in run
    ]
    bare.sort(key=lambda tool: tool.get("name", ""))
    if mark is not None:
        bare[-1] = {**bare[-1], "cache_control": mark}
    return bare


def normalize(body: dict[str, Any], settings: TenantSettings) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The normalized body and the names of the rules that changed it, in the order of `gateway.config.ALL_RULES`."""
    applied = []
    steps = (
        ("newlines", newlines),
        ("tool_schema_key_order", lambda b: _TOOL_SCHEMA_KEY_ORDER.apply(b).request),
        ("tool_order", tool_order),
    )
    for name, rule in steps:
        if name not in settings.rules:
            continue
        new = rule(body)
        if new is not body:
            applied.append(name)
            body = new
    return body, tuple(applied)
