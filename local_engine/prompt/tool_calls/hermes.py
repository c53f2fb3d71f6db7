"""The Hermes / Qwen tool-call format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Source: NousResearch Hermes-2-Pro function-calling format, as used by Qwen2.5's chat template. A call cut short
(by max_tokens) is completed as partial JSON (`partial-json-parser`, as vLLM does for streamed tool calls).
"""

from __future__ import annotations

import json
import re

import partial_json_parser

from local_engine.prompt.tool_calls.base import ToolCall, ToolCallFormat, arguments_json, new_call_id

# strict=False accepts a raw newline or tab inside a string, which models write and RFC 8259 forbids; the
# arguments are re-serialised (escaped) before they are returned.
_DECODER = json.JSONDecoder(strict=False)
_NAME = r'^\s*\{\s*"name"\s*:\s*"([^"\\]{1,64})"'
_FORCED = re.compile(_NAME + r'\s*,\s*"arguments"\s*:\s*(.*)$', re.DOTALL)
_WRITTEN_NAME = re.compile(_NAME)


def first_json_value(text: str) -> tuple[object, bool]:
    """The first JSON value in `text` (small models often keep writing after it), completing a truncated one, and
    whether it was whole; (None, False) when there is none."""
    text = text.strip()
    if not text:
        return None, False
    try:
        return _DECODER.raw_decode(text)[0], True
    except ValueError:
        pass
    try:
        return partial_json_parser.loads(text), False
    except Exception:  # noqa: BLE001 - the parser raises several kinds; any means "not JSON"
        return None, False


class HermesFormat(ToolCallFormat):
    template_marker = "<tool_call>"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    body_tail = "}"

    def body_head(self, function: str) -> str:
        return '{"name": ' + json.dumps(function) + ', "arguments": '

    def opening(self, function: str | None) -> str:
        if function is None:
            return self.open_tag + '{"name": "'
        return self.open_tag + self.body_head(function)

    def written_name(self, body: str) -> str | None:
        match = _WRITTEN_NAME.match(body)
        return match.group(1) if match else None

    def parse_body(self, body: str, forced_name: str | None) -> ToolCall | None:
        value, whole = first_json_value(body)
        if isinstance(value, dict) and isinstance(value.get("name"), str) and value["name"]:
            name = forced_name or value["name"]
            arguments = arguments_json(value.get("arguments", value.get("parameters")))
            return ToolCall(new_call_id(), name, arguments, complete=whole)
        if forced_name is None:
            return None
        # A call the prompt forced: the name is known. Arguments that are no JSON object at all become `{}`, so
        # that `arguments` is always a JSON object string.
        match = _FORCED.match(body)
        arguments, whole = first_json_value(match.group(2)) if match else (None, False)
        if not isinstance(arguments, dict):
            arguments, whole = {}, False
        return ToolCall(new_call_id(), forced_name, arguments_json(arguments), complete=whole)
