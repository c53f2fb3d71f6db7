"""Chat messages (and tools) to prompt token ids with the model's chat template.

Tools are rendered verbatim, in the order and key order the client sent, before the system prompt: the byte layout
of the prompt is exactly what the client controls, which is what makes prefix caching (and its misses) visible.

Only the template makes control tokens: text inside messages and tools that spells a special token (say a pasted
`<|im_end|>`) is encoded as ordinary text (`local_engine.prompt_encoding`).
"""

from __future__ import annotations

import json

from local_engine.chat_messages import check_messages
from local_engine.prompt_encoding import encode_rendered


def message_text(message: dict, index: int) -> str:
    """The message's text (content already validated by `chat_messages.check_messages`)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content)


def _render_tool_calls(tool_calls: list) -> str:
    lines = []
    for call in tool_calls:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments")
        lines.append(
            '<tool_call>{"name": ' + json.dumps(function.get("name")) + ', "arguments": '
            + ("{}" if arguments is None else arguments) + "}</tool_call>"
        )
    return "\n".join(lines)


def template_messages(messages: list, tools: list | None) -> list[dict]:
    """OpenAI-style messages to the plain `{role, content}` list a chat template expects."""
    check_messages(messages)
    rendered = []
    for index, message in enumerate(messages):
        role = message["role"]
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


def render_chat(tokenizer, plain: list[dict]) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in plain) + "assistant: "


def chat_prompt_token_ids(tokenizer, messages: list, tools: list | None, opening: str = "") -> list[int]:
    """Token ids of the prompt; `opening` is text the assistant turn starts with (to steer tool calls)."""
    plain = template_messages(messages, tools)
    return encode_rendered(tokenizer, plain, lambda items: render_chat(tokenizer, items), opening)
