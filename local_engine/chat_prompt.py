"""Chat messages (and tools) to prompt token ids with the model's chat template.

Tools are rendered verbatim, in the order and key order the client sent, before the system prompt: the byte layout
of the prompt is exactly what the client controls, which is what makes prefix caching (and its misses) visible.
"""

from __future__ import annotations

import json

from local_engine.errors import InvalidRequest

_ROLES = {"system", "developer", "user", "assistant", "tool"}


def message_text(message: dict, index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise InvalidRequest(
                    f"messages[{index}].content: only text parts are supported, got {kind!r}",
                    param=f"messages[{index}].content",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidRequest(f"messages[{index}].content must be a string or a list of parts", param="messages")


def _render_tool_calls(tool_calls: list) -> str:
    lines = []
    for call in tool_calls:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        lines.append(
            '<tool_call>{"name": ' + json.dumps(function.get("name")) + ', "arguments": '
            + str(function.get("arguments", "")) + "}</tool_call>"
        )
    return "\n".join(lines)


def template_messages(messages: list, tools: list | None) -> list[dict]:
    """OpenAI-style messages to the plain `{role, content}` list a chat template expects."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages")
    rendered = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{index}] must be an object", param="messages")
        role = message.get("role")
        if role not in _ROLES:
            raise InvalidRequest(f"messages[{index}].role must be one of {sorted(_ROLES)}", param="messages")
        text = message_text(message, index)
        if role == "assistant" and message.get("tool_calls"):
            text = (text + "\n" if text else "") + _render_tool_calls(message["tool_calls"])
        rendered.append({"role": "system" if role == "developer" else role, "content": text})
    if tools:
        tool_block = "# Tools\n" + "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        if rendered[0]["role"] == "system":
            rendered[0] = {"role": "system", "content": tool_block + "\n\n" + rendered[0]["content"]}
        else:
            rendered.insert(0, {"role": "system", "content": tool_block})
    return rendered


def chat_prompt_token_ids(tokenizer, messages: list, tools: list | None) -> list[int]:
    plain = template_messages(messages, tools)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    else:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in plain) + "assistant: "
    return tokenizer.encode(text, add_special_tokens=False)
