"""How a client re-sent the answer the gateway had returned (`db.ledger.ANSWER_REWRITES`).

The re-sent assistant message is compared with the answer by its text and its tool calls, in this order:

- the same text and tool calls (arguments as the same text): not rewritten (None);
- the text differs only in whitespace: `whitespace`;
- the text is the answer with its reasoning block (`<think>...</think>`, `<thinking>...</thinking>`) removed, give or
  take whitespace: `reasoning_stripped`;
- the text is a shorter start of the answer's: `truncated`;
- the same text, and each tool call's arguments are the same JSON value in other text: `tool_arguments`;
- anything else: `edited`.

The character offset is that of the re-sent message's segment text (`gateway.explain.segments`): the first character
where it differs from the same message carrying the answer as returned.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import msgspec

from gateway.conversations.answer import Answer, ToolCall, content_text, message_tool_calls
from gateway.conversations.link import AnswerRewrite

_ENCODER = msgspec.json.Encoder()  # keeps key order, as the segments' encoder does
_WHITESPACE = re.compile(r"\s+")
_REASONING = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.DOTALL)


def _squashed(text: str) -> str:
    return _WHITESPACE.sub("", text)


def _same_json(a: str, b: str) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except (ValueError, RecursionError):
        return False


def _kind(answer: Answer, content: str, calls: tuple[ToolCall, ...]) -> str | None:
    if content != answer.content:
        returned = answer.content
        if _squashed(content) == _squashed(returned):
            return "whitespace"
        stripped = _REASONING.sub("", returned)
        if stripped != returned and _squashed(content) == _squashed(stripped):
            return "reasoning_stripped"
        if content and returned.startswith(content.rstrip()):
            return "truncated"
        return "edited"
    if calls == answer.tool_calls:
        return None
    if len(calls) == len(answer.tool_calls) and all(
        sent.name == returned.name and _same_json(sent.arguments, returned.arguments)
        for sent, returned in zip(calls, answer.tool_calls, strict=True)
    ):
        return "tool_arguments"
    return "edited"


def _as_returned(message: dict[str, Any], answer: Answer) -> dict[str, Any]:
    """`message` carrying the answer's text and tool-call arguments, in the message's own shape."""
    expected = dict(message)
    content = message.get("content")
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict) and "text" in p]
        expected["content"] = [{**parts[0], "text": answer.content}] if parts else answer.content
    elif content is not None or answer.content:
        expected["content"] = answer.content
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        replaced = []
        for index, call in enumerate(calls):
            if index < len(answer.tool_calls) and isinstance(call, dict) and isinstance(call.get("function"), dict):
                returned = answer.tool_calls[index]
                call = {**call, "function": {**call["function"], "name": returned.name,
                                             "arguments": returned.arguments}}
            replaced.append(call)
        expected["tool_calls"] = replaced
    return expected


def segment_text(message: dict[str, Any]) -> str:
    """A message segment's text, by `gateway.explain.segments`' rule: the content of a plain `{role, content}` text
    message, else the message's compact JSON (key order kept)."""
    content = message.get("content")
    if isinstance(content, str) and len(message) == 2:
        return content
    return _ENCODER.encode(message).decode("utf-8", "replace")


def answer_rewrite(answer: Answer, message: Any, name: str, segment_index: int) -> AnswerRewrite | None:
    """How `message` (the re-sent answer: segment `name` at `segment_index` of the request's segments) differs from
    `answer`; None when it is the answer as returned (or not a message)."""
    if not isinstance(message, dict):
        return None
    kind = _kind(answer, content_text(message.get("content")), message_tool_calls(message))
    if kind is None:
        return None
    expected = segment_text(_as_returned(message, answer))
    offset = len(os.path.commonprefix([expected, segment_text(message)]))
    return AnswerRewrite(kind, name, segment_index, offset)
