"""Chat messages (and tools) to prompt token ids with the model's chat template, and where each token came from.

Tools are rendered verbatim, in the order and key order the client sent, before the system prompt: the byte layout
of the prompt is exactly what the client controls, which is what makes prefix caching (and its misses) visible. An
assistant's tool calls are rendered as the engine's tool-call format writes them, arguments verbatim, so an answer
the engine returned and the client re-sent as it was renders as the model wrote it.

Only the template makes control tokens: text inside messages and tools that spells a special token (say a pasted
`<|im_end|>`) is encoded as ordinary text (`local_engine.prompt.encoding`).
"""

from __future__ import annotations

import json
import re

from local_engine.prompt.chat_messages import check_messages
from local_engine.prompt.encoding import encode_rendered
from local_engine.prompt.layout import PROMPT, TOOLS, PromptLayout, Span, find_spans, message_segment

# Marks a part of the request in a second rendering (a private-use character no template adds).
_MARK = "\U000f0000"
# Where a forced call's opening ends (`local_engine.prompt.tool_calls`: the format's open tag and body head, the
# arguments left to the model): the prompt of a forced call ends there, and the model's tokens start there. An
# earlier call is encoded with a cut at the same place, so that the call re-sent as the engine returned it encodes
# to the tokens the engine cached (`"arguments": ` then `{"` rather than one ` {"` token across the boundary).
_CALL_HEAD = re.compile(r'<tool_call>\{"name": "(?:[^"\\]|\\.)*", "arguments": ')


def message_text(message: dict, index: int) -> str:
    """The message's text (content already validated by `chat_messages.check_messages`)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content)


def tool_calls_separator(content: str) -> str:
    """What goes between an assistant message's text and its tool calls: nothing when there is no text or it already
    ends in whitespace, else a newline. An answer the engine returned carries in its text what the model wrote
    before its first call (`local_engine.prompt.tool_calls.ToolCallStream`), usually that newline, so re-sent as
    returned it renders as the model wrote it and matches the tokens cached for it."""
    return "" if not content or content[-1].isspace() else "\n"


def _render_tool_calls(tool_calls: list) -> str:
    """Each call as the Hermes format writes it (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, the
    arguments text exactly as sent, never re-serialised: the model's own text is what the cache holds), one a
    line."""
    lines = []
    for call in tool_calls:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments")
        lines.append(
            '<tool_call>{"name": ' + json.dumps(function.get("name")) + ', "arguments": '
            + ("{}" if arguments is None else arguments) + "}</tool_call>"
        )
    return "\n".join(lines)


def _message_pieces(messages: list, tools: list | None) -> list[tuple[str, list]]:
    """OpenAI-style messages to `(role, pieces)`: each piece is template text (a str) or a `(segment, text)` part of
    the request, so that the content's characters can be traced back to the request."""
    check_messages(messages)
    rendered: list[tuple[str, list]] = []
    for index, message in enumerate(messages):
        role = message["role"]
        text = message_text(message, index)
        if role == "assistant" and message.get("tool_calls"):
            text = text + tool_calls_separator(text) + _render_tool_calls(message["tool_calls"])
        rendered.append(("system" if role == "developer" else role, [(message_segment(index, role), text)]))
    if tools:
        tool_part = (TOOLS, "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools))
        if rendered[0][0] == "system":
            rendered[0] = ("system", ["# Tools\n", tool_part, "\n\n", *rendered[0][1]])
        else:
            rendered.insert(0, ("system", ["# Tools\n", tool_part]))
    return rendered


def _content(pieces: list, marker=None) -> str:
    return "".join(piece if isinstance(piece, str) else (marker(piece) if marker else piece[1]) for piece in pieces)


def _plain(structured: list[tuple[str, list]]) -> list[dict]:
    return [{"role": role, "content": _content(pieces)} for role, pieces in structured]


def template_messages(messages: list, tools: list | None) -> list[dict]:
    """OpenAI-style messages to the plain `{role, content}` list a chat template expects."""
    return _plain(_message_pieces(messages, tools))


def render_chat(tokenizer, plain: list[dict]) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in plain) + "assistant: "


def _spans(tokenizer, structured: list[tuple[str, list]], text: str) -> tuple[Span, ...]:
    """The parts' spans in `text`: rendered once more with a marker in place of each part, which shows exactly where
    the template put it; when the template does not copy content verbatim, found by searching in order."""
    parts = [piece for _, pieces in structured for piece in pieces if not isinstance(piece, str)]
    numbered = {id(part): number for number, part in enumerate(parts)}
    marked = render_chat(
        tokenizer,
        [{"role": role, "content": _content(pieces, lambda p: f"{_MARK}{numbered[id(p)]}{_MARK}")}
         for role, pieces in structured],
    )
    pieces_of_marked = marked.split(_MARK)
    if len(pieces_of_marked) == 2 * len(parts) + 1:
        spans, position, rebuilt = [], 0, []
        for number, literal in enumerate(pieces_of_marked[0::2]):
            rebuilt.append(literal)
            position += len(literal)
            if number < len(parts):
                segment, part_text = parts[number]
                spans.append(Span(segment, position, position + len(part_text)))
                rebuilt.append(part_text)
                position += len(part_text)
        if "".join(rebuilt) == text:
            return tuple(span for span in spans if span.end > span.start)
    return find_spans(text, [(segment, part_text, 0) for segment, part_text in parts])


def chat_prompt(
    tokenizer, messages: list, tools: list | None, opening: str = ""
) -> tuple[list[int], PromptLayout | None]:
    """Prompt token ids of a chat request and its layout (None when the tokenizer gives no character offsets);
    `opening` is text the assistant turn starts with (to steer tool calls)."""
    structured = _message_pieces(messages, tools)
    plain = _plain(structured)
    encoded = encode_rendered(tokenizer, plain, lambda items: render_chat(tokenizer, items), opening, _CALL_HEAD)
    if encoded.offsets is None:
        return encoded.token_ids, None
    return encoded.token_ids, PromptLayout(_spans(tokenizer, structured, encoded.rendered), encoded.offsets)


def chat_prompt_token_ids(tokenizer, messages: list, tools: list | None, opening: str = "") -> list[int]:
    """Token ids of the prompt; `opening` is text the assistant turn starts with (to steer tool calls)."""
    return chat_prompt(tokenizer, messages, tools, opening)[0]


def text_prompt(tokenizer, text: str) -> tuple[list[int], PromptLayout | None]:
    """Prompt token ids of a completions prompt and its layout (the whole text is the `prompt` part). The text is
    the client's own, special-token text included, so it is encoded as it is."""
    if getattr(tokenizer, "is_fast", False):
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = tuple((int(start), int(end)) for start, end in encoding["offset_mapping"])
        spans = (Span(PROMPT, 0, len(text)),) if text else ()
        return list(encoding["input_ids"]), PromptLayout(spans, offsets)
    return tokenizer.encode(text, add_special_tokens=False), None
