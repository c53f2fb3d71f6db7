"""The Hermes / Qwen tool-call format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Source: NousResearch Hermes-2-Pro function-calling format, as used by Qwen2.5's chat template.
"""

from __future__ import annotations

import json
import re

from local_engine.tool_calls.base import ToolCall, ToolCallFormat, arguments_json, new_call_id

_DECODER = json.JSONDecoder()
_LENIENT = re.compile(r'^\s*\{\s*"name"\s*:\s*"([^"\\]{1,64})"\s*(?:,\s*"arguments"\s*:\s*(.*))?$', re.DOTALL)


class HermesFormat(ToolCallFormat):
    template_marker = "<tool_call>"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def opening(self, function: str | None, first_argument: str | None = None) -> str:
        if function is None:
            return '<tool_call>{"name": "'
        opening = '<tool_call>{"name": ' + json.dumps(function) + ', "arguments": {'
        return opening + (json.dumps(first_argument) + ": " if first_argument else "")

    def parse_body(self, body: str, forced_name: str | None) -> ToolCall | None:
        try:
            # The first JSON value of the body: small models often keep writing after the call.
            value, _ = _DECODER.raw_decode(body.lstrip())
        except ValueError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("name"), str) and value["name"]:
            return ToolCall(new_call_id(), value["name"], arguments_json(value.get("arguments", value.get("parameters"))))
        if forced_name is None:
            return None
        # A call the prompt forced: the name is known, so keep the model's arguments even when they are not valid
        # JSON (OpenAI documents the same for its own models: arguments may need validating).
        match = _LENIENT.match(body)
        raw = ((match.group(2) or "{}") if match else "{}").strip()
        while raw.endswith("}") and raw.count("}") > raw.count("{"):
            raw = raw[:-1].rstrip()  # the call's own closing brace
        try:
            return ToolCall(new_call_id(), forced_name, arguments_json(_DECODER.raw_decode(raw)[0]))
        except ValueError:
            return ToolCall(new_call_id(), forced_name, raw)
