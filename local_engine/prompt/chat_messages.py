"""Validation of a chat request's `messages`, `tools` and `tool_choice`, field by field, as OpenAI defines them.

Every problem is an `InvalidRequest` whose `param` names the exact field (`messages[2].tool_calls[0].function`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from local_engine.errors import InvalidRequest

ROLES = ("system", "developer", "user", "assistant", "tool")
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass(frozen=True)
class ToolChoice:
    """`mode` is "auto", "none" or "required"; `function` is set for a named function (mode "required")."""

    mode: str
    function: str | None = None


def _fail(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


def _check_content(content, param: str, nullable: bool) -> None:
    if content is None:
        if not nullable:
            raise _fail("content is required for this role", param)
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _fail("must be a string or a list of text parts", param)
    for index, part in enumerate(content):
        part_param = f"{param}[{index}]"
        if not isinstance(part, dict):
            raise _fail("must be an object", part_param)
        if part.get("type") != "text":
            raise _fail(f"only text parts are supported, got {part.get('type')!r}"[:200], f"{part_param}.type")
        if not isinstance(part.get("text"), str):
            raise _fail("must be a string", f"{part_param}.text")


def _check_tool_calls(tool_calls, param: str) -> None:
    if not isinstance(tool_calls, list):
        raise _fail("must be a list", param)
    for index, call in enumerate(tool_calls):
        call_param = f"{param}[{index}]"
        if not isinstance(call, dict):
            raise _fail("must be an object", call_param)
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise _fail("must be a string", f"{call_param}.id")
        if call.get("type") not in (None, "function"):
            raise _fail("must be 'function'", f"{call_param}.type")
        function = call.get("function")
        if not isinstance(function, dict):
            raise _fail("must be an object", f"{call_param}.function")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise _fail("must be a non-empty string", f"{call_param}.function.name")
        if function.get("arguments") is not None and not isinstance(function["arguments"], str):
            raise _fail("must be a string (JSON-encoded arguments)", f"{call_param}.function.arguments")


def check_messages(messages) -> None:
    if messages is None:
        raise InvalidRequest("missing required field: messages", param="messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages")
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _fail("must be an object", param)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _fail(f"must be one of {list(ROLES)}", f"{param}.role")
        tool_calls = message.get("tool_calls")
        if tool_calls is not None:
            if role != "assistant":
                raise _fail("only assistant messages carry tool_calls", f"{param}.tool_calls")
            _check_tool_calls(tool_calls, f"{param}.tool_calls")
        _check_content(message.get("content"), f"{param}.content", nullable=role == "assistant")
        for name in ("name", "tool_call_id", "refusal"):
            if message.get(name) is not None and not isinstance(message[name], str):
                raise _fail("must be a string", f"{param}.{name}")


def check_tools(tools) -> list[dict] | None:
    """The validated `tools` list, or None when absent, null or empty."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be a list", param="tools")
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise _fail("must be an object", param)
        if tool.get("type") != "function":
            raise _fail("must be 'function'", f"{param}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise _fail("must be an object", f"{param}.function")
        name = function.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
            raise _fail("must be 1-64 characters of a-z, A-Z, 0-9, _, ., : or -", f"{param}.function.name")
        if function.get("description") is not None and not isinstance(function["description"], str):
            raise _fail("must be a string", f"{param}.function.description")
        if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
            raise _fail("must be an object (a JSON Schema)", f"{param}.function.parameters")
        if function.get("strict") is not None and not isinstance(function["strict"], bool):
            raise _fail("must be a boolean", f"{param}.function.strict")
    return tools or None


def parse_tool_choice(value, tools: list[dict] | None) -> ToolChoice:
    """OpenAI's `tool_choice`: "auto" (the default with tools), "none" (the default without), "required", or
    `{"type": "function", "function": {"name": ...}}` naming one of `tools`."""
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if value in ("auto", "none", "required"):
        if value != "none" and not tools:
            raise InvalidRequest(f"tool_choice={value!r} needs a non-empty tools list", param="tool_choice")
        return ToolChoice(value)
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        names = [tool["function"]["name"] for tool in tools or ()]
        if not isinstance(name, str) or name not in names:
            raise InvalidRequest(f"tool_choice names a function not in tools (tools: {names})"[:500],
                                 param="tool_choice")
        return ToolChoice("required", name)
    raise InvalidRequest(
        "tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}",
        param="tool_choice",
    )
