"""Semantics-preserving rules: canonical JSON key order in tools, stable tool order, tool-call arguments as the
gateway returned them, newline and BOM normalization.

Chat templates render tools and tool-call arguments with `json.dumps` in the order the client sent them, so two
agents sending the same schema with keys in another order produce different prompt bytes and miss the cache.

No rule changes an answer the gateway returned when the client re-sends it as returned: the upstream cached that
answer as its model wrote it, so any other spelling misses from there on. `Newlines` leaves assistant messages alone,
and `ToolCallArgumentsKeyOrder` only ever writes a re-sent tool call back as it was returned.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec

from gateway.normalize.base import Request, RuleResult, unchanged

# Keeps dict insertion order, so two lists that differ only in key order encode differently.
_ORDER_PRESERVING_ENCODER = msgspec.json.Encoder()


def sort_keys_recursive(value: Any) -> tuple[Any, bool]:
    """Return `value` with every dict's keys in sorted order, and whether anything moved.

    Unchanged sub-trees are returned as the same objects; changed ones are fresh copies (the input is never
    mutated).
    """
    if isinstance(value, dict):
        changed = False
        items = []
        for key, item in value.items():
            new_item, item_changed = sort_keys_recursive(item)
            changed = changed or item_changed
            items.append((key, new_item))
        keys = [key for key, _ in items]
        if any(not isinstance(key, str) for key in keys):
            return (dict(items), True) if changed else (value, False)
        if keys != sorted(keys):
            items.sort(key=lambda pair: pair[0])
            changed = True
        return (dict(items), True) if changed else (value, False)
    if isinstance(value, list):
        changed = False
        new_items = []
        for item in value:
            new_item, item_changed = sort_keys_recursive(item)
            changed = changed or item_changed
            new_items.append(new_item)
        return (new_items, True) if changed else (value, False)
    return value, False


class ToolSchemaKeyOrder:
    """Sort keys recursively inside every tool definition (the function's name, description and JSON schema).

    Agents send the same tool list on every call, so results are memoized by the list's serialized form
    (encoding is much cheaper than walking and rebuilding the schemas). Memoized lists are shared between
    results and never mutated.
    """

    name = "tool_schema_key_order"
    _MEMO_ENTRIES = 512

    def __init__(self) -> None:
        self._memo: dict[bytes, tuple[list[Any], bool]] = {}

    def apply(self, request: Request) -> RuleResult:
        tools = request.get("tools")
        if not isinstance(tools, list) or not tools:
            return unchanged(request)
        try:
            key: bytes | None = _ORDER_PRESERVING_ENCODER.encode(tools)
        except (TypeError, ValueError, msgspec.EncodeError):
            key = None
        memo = self._memo.get(key) if key is not None else None
        if memo is None:
            memo = sort_keys_recursive(tools)
            if key is not None:
                if len(self._memo) >= self._MEMO_ENTRIES:
                    self._memo.clear()
                self._memo[key] = memo
        new_tools, changed = memo
        if not changed:
            return unchanged(request)
        return RuleResult({**request, "tools": new_tools}, True)


def _tool_sort_key(tool: Any) -> tuple[str, str]:
    if not isinstance(tool, dict):
        return ("~", "")
    function = tool.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return (str(tool.get("type", "")), name if isinstance(name, str) else "")


class ToolOrder:
    """Sort tools by (type, function name); a stable sort keeps same-named tools in their order."""

    name = "tool_order"

    def apply(self, request: Request) -> RuleResult:
        tools = request.get("tools")
        if not isinstance(tools, list) or len(tools) < 2:
            return unchanged(request)
        keys = [_tool_sort_key(tool) for tool in tools]
        if all(keys[i] <= keys[i + 1] for i in range(len(keys) - 1)):
            return unchanged(request)
        order = sorted(range(len(tools)), key=keys.__getitem__)
        return RuleResult({**request, "tools": [tools[i] for i in order]}, True)


def canonical_json_text(text: str) -> str | None:
    """`text` re-serialised with sorted keys and compact separators, or None when it is not JSON."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):
        return None


ReturnedArguments = Callable[[str, str], str | None]
"""`(function name, arguments text re-sent) -> arguments text as the gateway returned that call`, or None when the
text is as returned or no such call was returned (`gateway.conversations.returned.ReturnedCalls.lookup_for`)."""


class ToolCallArgumentsKeyOrder:
    """Write each re-sent assistant tool call's arguments back exactly as the gateway returned them.

    A client that re-serialises the arguments of the answer it was given (keys in another order, other spacing or
    escapes: the same JSON value) sends text the upstream never cached; the text as returned matches what it cached.
    `returned` looks the call up in what the gateway returned to this tenant; without it (or for a call it does not
    know, or one re-sent as returned) nothing changes: re-serialising arguments the upstream wrote would itself cost
    the cache everything after them.
    """

    name = "tool_call_arguments_key_order"

    def __init__(self, returned: ReturnedArguments | None = None) -> None:
        self._returned = returned

    def apply(self, request: Request) -> RuleResult:
        messages = request.get("messages")
        if self._returned is None or not isinstance(messages, list):
            return unchanged(request)
        new_messages = None
        for index, message in enumerate(messages):
            new_message = self._message(message)
            if new_message is not message:
                if new_messages is None:
                    new_messages = list(messages)
                new_messages[index] = new_message
        if new_messages is None:
            return unchanged(request)
        return RuleResult({**request, "messages": new_messages}, True)

    def _message(self, message: Any) -> Any:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            return message
        calls = message.get("tool_calls")
        if not isinstance(calls, list):
            return message
        new_calls = restored_calls(calls, self._returned)
        return message if new_calls is calls else {**message, "tool_calls": new_calls}


def restored_calls(calls: list[Any], returned: ReturnedArguments | None) -> list[Any]:
    """OpenAI `tool_calls` with each call's arguments as `returned` gives them back (the same list when none
    changes)."""
    if returned is None:
        return calls
    new_calls = None
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
            continue
        as_returned = returned(function.get("name"), function["arguments"])
        if as_returned is None or as_returned == function["arguments"]:
            continue
        if new_calls is None:
            new_calls = list(calls)
        new_calls[index] = {**call, "function": {**function, "arguments": as_returned}}
    return calls if new_calls is None else new_calls


def normalize_newlines(text: str) -> str:
    """CRLF and lone CR become LF; byte-order marks are removed."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\ufeff" in text:
        text = text.replace("\ufeff", "")
    return text


def _content(content: Any) -> Any:
    """Normalized message content (a string or a list of content parts), or the same object if unchanged."""
    if isinstance(content, str):
        new = normalize_newlines(content)
        return content if new == content else new
    if isinstance(content, list):
        new_parts = None
        for index, part in enumerate(content):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                text = normalize_newlines(part["text"])
                if text != part["text"]:
                    if new_parts is None:
                        new_parts = list(content)
                    new_parts[index] = {**part, "text": text}
        return content if new_parts is None else new_parts
    return content


class Newlines:
    """Normalize line endings and strip BOMs in message text (strings and text parts) and completion prompts.

    Assistant messages are left as they are: they are answers, re-sent, and a `\r` or BOM in one is what the model
    wrote and the upstream cached."""

    name = "newlines"

    def apply(self, request: Request) -> RuleResult:
        changes: dict[str, Any] = {}
        messages = request.get("messages")
        if isinstance(messages, list):
            new_messages = None
            for index, message in enumerate(messages):
                if not isinstance(message, dict) or "content" not in message or message.get("role") == "assistant":
                    continue
                content = _content(message["content"])
                if content is not message["content"]:
                    if new_messages is None:
                        new_messages = list(messages)
                    new_messages[index] = {**message, "content": content}
            if new_messages is not None:
                changes["messages"] = new_messages
        prompt = request.get("prompt")
        if isinstance(prompt, str):
            new_prompt = normalize_newlines(prompt)
            if new_prompt != prompt:
                changes["prompt"] = new_prompt
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            new_list = [normalize_newlines(p) for p in prompt]
            if new_list != prompt:
                changes["prompt"] = new_list
        if not changes:
            return unchanged(request)
        return RuleResult({**request, **changes}, True)
