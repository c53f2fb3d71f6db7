"""Responses <-> OpenAI Chat Completions, for upstreams that speak the chat API (the local engine, vLLM, SGLang).

Request (Responses -> chat), after OpenAI's API reference ("Responses: create", "Migrate to the Responses API"):
`instructions` becomes a leading system message (the previous response's instructions are not carried over, as
OpenAI documents); the conversation stored for `previous_response_id` follows; then `input`: a string is one user
message; a `message` item keeps its role and its text parts joined; consecutive `function_call` items become one
assistant message's `tool_calls` (joined to the assistant text just before them); a `function_call_output` becomes a
`tool` message. Function tools `{"type": "function", "name", "description", "parameters", "strict"}` become chat tools
(strict unless `strict` is false, as on OpenAI's Responses API);
`tool_choice` keeps `auto` / `none` / `required` and `{"type": "function", "name"}` becomes a named function;
`text.format` becomes `response_format` (`json_schema` with its `name`, `schema`, `strict`, `description`);
`max_output_tokens` becomes `max_tokens`; `temperature`, `top_p`, `parallel_tool_calls` and `user` keep their names.
Anything a chat upstream cannot be asked for (images, files, built-in tools, reasoning items, background mode) is a
400 that names it.

Response (chat -> Responses): the assistant's text becomes a `message` item with one `output_text` part, each tool
call a `function_call` item; `finish_reason: length` makes the response `incomplete` (`max_output_tokens`).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from gateway.errors import BadRequest

TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_TOOL_CHOICES = ("auto", "none", "required")
_ROLES = ("user", "assistant", "system", "developer")
# Fields a chat upstream cannot honour; refused rather than silently dropped.
_REFUSED = {
    "background": "background mode",
    "conversation": "server-side conversations",
    "prompt": "reusable prompt templates",
    "max_tool_calls": "a limit on built-in tool calls",
}


def new_id(prefix: str) -> str:
    """A fresh id in OpenAI's style (`resp_...`, `msg_...`, `fc_...`): 24 random bytes in hex."""
    return f"{prefix}_{secrets.token_hex(24)}"


def _text_of_parts(parts: list[Any], param: str, *, refusal_ok: bool) -> str:
    texts = []
    for index, part in enumerate(parts):
        where = f"{param}[{index}]"
        if not isinstance(part, dict):
            raise BadRequest(f"{where} must be an object.", param=where)
        kind = part.get("type")
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and refusal_ok and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise BadRequest(
                f"{where}: content of type {str(kind)[:40]!r} is not supported on this upstream; send text parts "
                "(input_text, output_text).",
                param=f"{where}.type",
            )
    return "".join(texts)


def _content_text(content: Any, param: str, *, refusal_ok: bool = False) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return _text_of_parts(content, param, refusal_ok=refusal_ok)
    raise BadRequest(f"{param} must be a string or an array of content parts.", param=param)


def _string_field(item: dict[str, Any], name: str, param: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise BadRequest(f"{param}.{name} must be a string.", param=f"{param}.{name}")
    return value


def input_messages(value: Any) -> list[dict[str, Any]]:
    """The chat messages of a Responses `input` (a string or items). Raises `BadRequest` naming the item."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        param = f"input[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise BadRequest(f"{param}.role must be one of {list(_ROLES)}.", param=f"{param}.role")
            text = _content_text(item.get("content"), f"{param}.content", refusal_ok=role == "assistant")
            messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call = {
                "id": _string_field(item, "call_id", param),
                "type": "function",
                "function": {
                    "name": _string_field(item, "name", param),
                    "arguments": _string_field(item, "arguments", param),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last["content"] == "":
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = _content_text(item.get("output"), f"{param}.output")
            messages.append({"role": "tool", "tool_call_id": _string_field(item, "call_id", param), "content": output})
        else:
            raise BadRequest(
                f"{param}: input items of type {str(kind)[:40]!r} are not supported on this upstream; send message, "
                "function_call and function_call_output items.",
                param=f"{param}.type",
            )
    return messages


def _chat_tool(tool: Any, param: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise BadRequest(
            f"{param}: tools of type {str(kind)[:40]!r} are not supported on this upstream; only function tools are.",
            param=f"{param}.type",
        )
    function: dict[str, Any] = {"name": _string_field(tool, "name", param)}
    if tool.get("description") is not None:
        function["description"] = _string_field(tool, "description", param)
    parameters = tool.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise BadRequest(f"{param}.parameters must be an object.", param=f"{param}.parameters")
        function["parameters"] = parameters
    # Strict unless the client opts out: OpenAI's Responses API enforces a function tool's schema when `strict` is
    # left out (Chat Completions does not), so a Responses client expects its arguments to match the schema.
    if tool.get("strict") is not False:
        function["strict"] = True
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice in _TOOL_CHOICES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest(
        "tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...} on this upstream.",
        param="tool_choice",
    )


def response_format(text: Any) -> dict[str, Any] | None:
    """The chat `response_format` for a Responses `text` object (None: plain text). Raises `BadRequest`."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise BadRequest("'text' must be an object.", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest("text.format must be an object.", param="text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(fmt.get("name"), str) or not isinstance(schema, dict):
            raise BadRequest(
                "text.format of type json_schema needs a string 'name' and an object 'schema'.", param="text.format"
            )
        json_schema: dict[str, Any] = {"name": fmt["name"], "schema": schema}
        for name in ("description", "strict"):
            if fmt.get(name) is not None:
                json_schema[name] = fmt[name]
        return {"type": "json_schema", "json_schema": json_schema}
    raise BadRequest(
        f"text.format.type must be 'text', 'json_object' or 'json_schema', not {str(kind)[:40]!r}.",
        param="text.format.type",
    )


def check_chat_translatable(body: dict[str, Any]) -> None:
    """Refuse what a chat upstream cannot honour (see `_REFUSED`, and reasoning with an effort set)."""
    for name, what in _REFUSED.items():
        if body.get(name) not in (None, False):
            raise BadRequest(f"'{name}': {what} are not supported on this upstream.", param=name)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and any(v is not None for v in reasoning.values()):
        raise BadRequest("'reasoning': reasoning options are not supported on this upstream.", param="reasoning")


def to_chat_body(body: dict[str, Any], history: list[dict[str, Any]], *, stream: bool) -> dict[str, Any]:
    """The chat completions body for a Responses body after the stored conversation `history` (chat messages)."""
    check_chat_translatable(body)
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    messages.extend(history)
    messages.extend(input_messages(body["input"]))
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("'tools' must be an array.", param="tools")
        if tools:
            chat["tools"] = [_chat_tool(tool, f"tools[{index}]") for index, tool in enumerate(tools)]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = response_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for name in ("temperature", "top_p", "parallel_tool_calls", "user"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if stream:
        chat["stream"] = True
    return chat


def message_item(text: str, item_id: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": [part]}


def function_call_item(call: dict[str, Any], item_id: str, status: str = "completed") -> dict[str, Any]:
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": str(call.get("id") or new_id("call")),
        "name": str(function.get("name") or ""),
        "arguments": function.get("arguments") if isinstance(function.get("arguments"), str) else "{}",
        "status": status,
    }


def output_items(message: dict[str, Any], status: str = "completed") -> list[dict[str, Any]]:
    """The output items of a chat `message`: its text as a message item, then one function_call per tool call.

    `status` is the response's: when it is `incomplete` (cut at `max_output_tokens`), the last item is the one the
    limit cut short and is marked `incomplete`, as OpenAI marks it, so an agent never runs a truncated call.
    """
    items: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        items.append(message_item(text, new_id("msg")))
    for call in message.get("tool_calls") or ():
        if isinstance(call, dict):
            items.append(function_call_item(call, new_id("fc")))
    if items and status == "incomplete":
        items[-1]["status"] = "incomplete"
    return items


def history_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the chat messages a later turn continues from (one assistant message)."""
    text = "".join(
        part.get("text", "") for item in output if item.get("type") == "message" for part in item.get("content", ())
    )
    calls = [
        {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
        for item in output
        if item.get("type") == "function_call"
    ]
    if not text and not calls:
        return [{"role": "assistant", "content": ""}]
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return [message]


def usage_object(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, Any]:
    """Responses `usage`. Cache writes are the prompt tokens computed rather than read: an engine with a prefix
    cache stores every prompt token it computes."""
    cached = min(cached_tokens, prompt_tokens)
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": prompt_tokens - cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + output_tokens,
    }


def response_object(
    body: dict[str, Any],
    response_id: str,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    incomplete_reason: str | None = None,
    created_at: int | None = None,
) -> dict[str, Any]:
    """A Response object (`openai.types.responses.Response`) echoing the request's settings."""
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None if incomplete_reason is None else {"reason": incomplete_reason},
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "model": body["model"],
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "prompt_cache_retention": body.get("prompt_cache_retention"),
        "reasoning": {"effort": None, "summary": None},
        "store": body.get("store", True) is not False,
        "temperature": body.get("temperature"),
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation") or "disabled",
        "usage": usage,
        "user": body.get("user"),
    }


def finish_status(finish_reason: Any) -> tuple[str, str | None]:
    """(status, incomplete reason) for a chat `finish_reason`."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None
