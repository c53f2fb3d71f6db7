"""A request's prompt token ids, computed in the gateway with the replica's own tokenizer (the `tokenizers` package
and the model's chat template rendered with Jinja2, as transformers renders it; no torch).

Where the tokenizer comes from: `[upstreams.router] tokenizer = PATH`, a `tokenizer.json` file or a model directory
holding `tokenizer.json` and `tokenizer_config.json` (its `chat_template`, `bos_token`, `eos_token`); for a
`local_engine` replica set without one, the engine's `GET /v1/tokenizer` (the model it serves).

How the prompt is laid out depends on the server: prefixscope's engine renders tools as JSON lines in the system
message and assistant tool calls as `<tool_call>` lines (`local_engine/prompt/chat_prompt.py`), encoded with a cut
where each call's arguments start; vLLM and SGLang hand `messages` and `tools` to the template as they are. Both
encode the rendered text without adding special tokens (the template writes them). A prediction from a prompt the gateway laid out differently from the engine only ends
its match early; it never claims blocks the engine does not hold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


# Where the engine cuts its prompt text before encoding (`local_engine/prompt/chat_prompt.py`): after each tool call's
# head, where a forced call's arguments (the model's own tokens) start.
_ENGINE_CALL_HEAD = re.compile(r'<tool_call>\{"name": "(?:[^"\\]|\\.)*", "arguments": ')


class TokenizerUnavailable(ValueError):
    """The configured tokenizer cannot be loaded."""


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    # The options and helpers transformers gives chat templates (`apply_chat_template`).
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None, ensure_ascii=False, separators=None, sort_keys=False: json.dumps(
        value, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class RequestTokenizer:
    """Prompt token ids of chat and completions bodies, laid out as `style` (`local_engine` or `template`) does."""

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None, specials: Mapping[str, str | None],
                 style: str) -> None:
        self.tokenizer = tokenizer
        self.style = style
        self.specials = {name: value or "" for name, value in specials.items()}
        self._template = _environment().from_string(chat_template) if chat_template else None

    @classmethod
    def from_path(cls, path: str, style: str) -> RequestTokenizer:
        """A `tokenizer.json` file, or a model directory with `tokenizer.json` (and `tokenizer_config.json`).
        Raises `TokenizerUnavailable`."""
        location = Path(path).expanduser()
        file = location / "tokenizer.json" if location.is_dir() else location
        config_file = file.parent / "tokenizer_config.json"
        try:
            tokenizer = Tokenizer.from_file(str(file))
            config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        except (OSError, ValueError, Exception) as error:  # tokenizers raises its own Exception type
            raise TokenizerUnavailable(f"cannot load the tokenizer {path!r}: {error}") from None
        template = config.get("chat_template")
        if isinstance(template, list):  # several named templates: the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        specials = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token")}
        return cls(tokenizer, template if isinstance(template, str) else None, specials, style)

    @classmethod
    def from_engine(cls, payload: Mapping[str, Any]) -> RequestTokenizer:
        """From prefixscope's engine (`GET /v1/tokenizer`). Raises `TokenizerUnavailable`."""
        try:
            tokenizer = Tokenizer.from_str(payload["tokenizer"])
        except (KeyError, TypeError, Exception) as error:
            raise TokenizerUnavailable(f"the engine's tokenizer cannot be loaded: {error}") from None
        specials = {"bos_token": payload.get("bos_token"), "eos_token": payload.get("eos_token")}
        return cls(tokenizer, payload.get("chat_template"), specials, "local_engine")

    def prompt_token_ids(self, endpoint: str, body: Mapping[str, Any]) -> list[int] | None:
        """The prompt's token ids, or None when the body is not one this knows how to lay out."""
        try:
            if endpoint == "completions":
                prompt = body.get("prompt")
                return self.encode(prompt) if isinstance(prompt, str) else None
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return None
            tools = body.get("tools") if isinstance(body.get("tools"), list) else None
            text = self.render(messages, tools)
            if self.style != "local_engine":
                return self.encode(text)
            cuts = [0, *(match.end() for match in _ENGINE_CALL_HEAD.finditer(text)), len(text)]
            return [token for start, end in zip(cuts, cuts[1:]) for token in self.encode(text[start:end])]
        except (jinja2.TemplateError, TypeError, KeyError, AttributeError, ValueError):
            return None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def render(self, messages: list, tools: list | None) -> str:
        if self.style == "local_engine":
            plain, tools = engine_messages(messages, tools), None
        else:
            plain = [{**m, "content": _text(m.get("content"), "\n")} if isinstance(m.get("content"), list) else m
                     for m in messages]
        if self._template is None:
            return "".join(f"{m['role']}: {m['content']}\n" for m in plain) + "assistant: "
        variables = {"messages": plain, "add_generation_prompt": True, **self.specials}
        if tools:
            variables["tools"] = tools
        return self._template.render(**variables)


def engine_messages(messages: list, tools: list | None) -> list[dict]:
    """The `{role, content}` list prefixscope's engine hands its template (`local_engine.prompt.chat_prompt`)."""
    plain = []
    for message in messages:
        role = message["role"]
        text = _text(message.get("content"), "")
        if role == "assistant" and message.get("tool_calls"):
            # As the engine joins them: a newline unless the text is empty or already ends in whitespace.
            separator = "" if not text or text[-1].isspace() else "\n"
            text = text + separator + "\n".join(_tool_call_line(call) for call in message["tool_calls"])
        plain.append({"role": "system" if role == "developer" else role, "content": text})
    if tools:
        listed = "# Tools\n" + "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        if plain[0]["role"] == "system":
            plain[0] = {"role": "system", "content": listed + "\n\n" + plain[0]["content"]}
        else:
            plain.insert(0, {"role": "system", "content": listed})
    return plain


def _text(content: Any, joiner: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return joiner.join(part["text"] for part in content if isinstance(part, dict) and part.get("type") == "text")


def _tool_call_line(call: Any) -> str:
    function = call.get("function", {}) if isinstance(call, dict) else {}
    arguments = function.get("arguments")
    return ('<tool_call>{"name": ' + json.dumps(function.get("name")) + ', "arguments": '
            + ("{}" if arguments is None else arguments) + "}</tool_call>")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older tokenizer configs
        value = value.get("content")
    return value if isinstance(value, str) else None
