"""Anthropic Messages <-> OpenAI Chat Completions, for upstreams that speak the chat API (the local engine, vLLM...).

Request (Anthropic -> OpenAI): `system` becomes a leading system message (text blocks joined without separator, as
the engine joins text parts); a user message's `tool_result` blocks become `tool` messages (in order, before the
user's own text); an assistant's `tool_use` blocks become `tool_calls` with the input as a JSON string; tools become
`{"type": "function", "function": {name, description, parameters}}`; `tool_choice` auto/any/tool/none becomes
"auto"/"required"/a named function/"none"; `stop_sequences` becomes `stop`, `metadata.user_id` becomes `user`.
`cache_control` marks are dropped (the engine caches every prefix; breakpoints only shape the usage report).

Response (OpenAI -> Anthropic): text and `tool_calls` become `text` and `tool_use` blocks; `finish_reason` maps to
`stop_reason` (stop -> end_turn, or stop_sequence when the upstream says which stop string matched; length ->
max_tokens; tool_calls -> tool_use).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.anthropic.request import Breakpoint
from gateway.normalize.rules import ReturnedArguments, restored_calls


@dataclass(frozen=True, slots=True)
class ChatStyle:
    """How the chat body is written where OpenAI clients differ and the chat normalization rules would settle it: with
    `sorted_tool_keys` the tool wrappers' keys are in sorted order (as `tool_schema_key_order` leaves a chat request),
    else in the OpenAI SDK's order. The same Messages request and the same chat request then render the same prompt.
    Tool-call arguments are always `json.dumps` output, keys in the order sent: the text chat upstreams (the local
    engine, vLLM, SGLang) return for a call, so a `tool_use` re-sent as returned renders as the upstream cached it;
    with `returned` (`tool_call_arguments_key_order` on) a call the gateway returned in other text is written as
    returned (`gateway.normalize.rules.restored_calls`)."""

    sorted_tool_keys: bool = True
    returned: ReturnedArguments | None = field(default=None, compare=False)


DEFAULT_STYLE = ChatStyle()

_FINISH_TO_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(block.get("text", "") for block in content if isinstance(block, dict))
    return ""


def _tool_result_message(block: dict[str, Any]) -> dict[str, Any]:
    text = _text_of(block.get("content"))
    if block.get("is_error") is True:
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def tool_arguments(arguments: dict[str, Any]) -> str:
    """A tool_use input as the JSON string of an OpenAI tool call (the engine renders it verbatim)."""
    return json.dumps(arguments, ensure_ascii=False)


def restores_calls(body: dict[str, Any], style: ChatStyle) -> bool:
    """Whether `to_chat_body(body, style)` writes any `tool_use` of `body` back as the gateway returned it, in other
    text than `tool_arguments` gives (`style.returned`)."""
    if style.returned is None:
        return False
    return any(
        style.returned(block.get("name"), tool_arguments(block["input"])) is not None
        for message in body.get("messages") or ()
        if isinstance(message, dict) and message.get("role") == "assistant" and isinstance(message.get("content"), list)
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_use" and isinstance(block.get("input"), dict)
    )


def _messages(message: dict[str, Any], style: ChatStyle) -> list[dict[str, Any]]:
    role, content = message["role"], message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "user":
        out = [_tool_result_message(b) for b in content if b.get("type") == "tool_result"]
        texts = [b for b in content if b.get("type") == "text"]
        if texts or not out:
            out.append({"role": "user", "content": _text_of(texts)})
        return out
    text = _text_of([b for b in content if b.get("type") == "text"])
    calls = [
        {
            "id": b["id"],
            "type": "function",
            "function": {"name": b["name"], "arguments": tool_arguments(b["input"])},
        }
        for b in content
        if b.get("type") == "tool_use"
    ]
    calls = restored_calls(calls, style.returned)
    assistant: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        assistant["tool_calls"] = calls
    return [assistant]


def _tool(tool: dict[str, Any], style: ChatStyle) -> dict[str, Any]:
    described = tool.get("description") is not None
    if style.sorted_tool_keys:
        function: dict[str, Any] = {"description": tool["description"]} if described else {}
        function["name"] = tool["name"]
        function["parameters"] = tool["input_schema"]
        return {"function": function, "type": "function"}
    function = {"name": tool["name"]}
    if described:
        function["description"] = tool["description"]
    function["parameters"] = tool["input_schema"]
    return {"type": "function", "function": function}


def _tool_choice(choice: dict[str, Any]) -> Any:
    kind = choice["type"]
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice["name"]}}
    return kind  # auto | none


def to_chat_body(body: dict[str, Any], *, stream: bool, style: ChatStyle = DEFAULT_STYLE) -> dict[str, Any]:
    """The OpenAI chat completions body for a validated Messages body (see the module docstring)."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        text = _text_of(system)
        if text or isinstance(system, str):
            messages.append({"role": "system", "content": text})
    for message in body["messages"]:
        messages.extend(_messages(message, style))
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("tools"):
        chat["tools"] = [_tool(tool, style) for tool in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        chat["tool_choice"] = _tool_choice(choice)
        if choice.get("disable_parallel_tool_use") is True:
            chat["parallel_tool_calls"] = False
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    user_id = (body.get("metadata") or {}).get("user_id")
    if isinstance(user_id, str):
        chat["user"] = user_id
    if stream:
        chat["stream"] = True
    return chat


def cut_at(body: dict[str, Any], breakpoint: Breakpoint) -> dict[str, Any]:
    """The Messages body up to and including the block that carries `breakpoint` (for counting the tokens of the
    prefix it marks). A cut with no message keeps an empty system message, since a chat request needs one."""
    if breakpoint.section == "tools":
        return {"model": body["model"], "tools": body["tools"][: breakpoint.index + 1], "system": "", "messages": []}
    cut: dict[str, Any] = {"model": body["model"], "tools": body.get("tools")}
    if breakpoint.section == "system":
        cut["system"] = body["system"][: breakpoint.index + 1]
        cut["messages"] = []
        return cut
    cut["system"] = body.get("system")
    messages = list(body["messages"][: breakpoint.index])
    last = body["messages"][breakpoint.index]
    assert breakpoint.block is not None
    messages.append({**last, "content": last["content"][: breakpoint.block + 1]})
    cut["messages"] = messages
    return cut


def cut_chat_body(body: dict[str, Any], breakpoint: Breakpoint, style: ChatStyle = DEFAULT_STYLE) -> dict[str, Any]:
    """`cut_at` as a chat body (with at least one message)."""
    cut = cut_at(body, breakpoint)
    messages: list[dict[str, Any]] = []
    if cut.get("system") is not None:
        messages.append({"role": "system", "content": _text_of(cut["system"])})
    for message in cut["messages"]:
        messages.extend(_messages(message, style))
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if cut.get("tools"):
        chat["tools"] = [_tool(tool, style) for tool in cut["tools"]]
    return chat


def stop_reason(finish_reason: Any, matched_stop: Any, stop_sequences: Any) -> tuple[str, str | None]:
    """(`stop_reason`, `stop_sequence`) for an OpenAI `finish_reason`. `matched_stop` is the stop string the upstream
    says it matched (vLLM's `stop_reason`, SGLang's `matched_stop`), when it says."""
    if finish_reason == "stop" and isinstance(matched_stop, str) and matched_stop in (stop_sequences or ()):
        return "stop_sequence", matched_stop
    return _FINISH_TO_STOP.get(finish_reason, "end_turn"), None


def parse_arguments(arguments: Any) -> dict[str, Any]:
    """A tool call's JSON-string arguments as the `input` object (an unparsable string is kept under `_raw`)."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_value": value}


def message_content(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The content blocks of an OpenAI chat `message`: its text, then one `tool_use` per tool call."""
    blocks: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": parse_arguments(function.get("arguments")),
            }
        )
    return blocks


def matched_stop_of(choice: dict[str, Any]) -> Any:
    """The stop string an upstream reports it matched (vLLM: `stop_reason`; SGLang: `matched_stop`)."""
    value = choice.get("stop_reason")
    return value if isinstance(value, str) else choice.get("matched_stop")
