"""Parsing and validating a Messages API request body; finding its `cache_control` breakpoints.

Accepted (Anthropic's API reference, "Messages"): `model`, `max_tokens` (required), `messages` with string content
or `text` / `tool_use` / `tool_result` blocks, `system` as a string or text blocks, `tools` with `input_schema`,
`tool_choice` (`auto`, `any`, `tool`, `none`), `temperature`, `top_p`, `top_k`, `stop_sequences`,
`metadata.user_id`, `stream`. Blocks this gateway cannot forward (`image`, `document`, `thinking`, server tools...)
are refused with a 400 that names them. Bad input raises `gateway.errors.BadRequest`.

Breakpoints follow Anthropic's prompt-caching rules ("Prompt caching"): at most `MAX_BREAKPOINTS` blocks carry
`cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}` (5m when `ttl` is absent), counted in prompt order
(tools, then system, then messages), and a 1h breakpoint may not follow a 5m one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.errors import BadRequest
from gateway.parsing import decode_json_object

MAX_BREAKPOINTS = 4
TTL_5M = "5m"
TTL_1H = "1h"
TTLS = (TTL_5M, TTL_1H)

_USER_BLOCKS = frozenset({"text", "tool_result"})
_ASSISTANT_BLOCKS = frozenset({"text", "tool_use"})
_TOOL_RESULT_BLOCKS = frozenset({"text"})
_ROLES = ("user", "assistant")


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """One `cache_control` mark: where it sits (`tools`, `system` or `messages`; the index in that list; for a message,
    the index of the block) and its lifetime class."""

    section: str
    index: int
    block: int | None
    ttl: str

    @property
    def label(self) -> str:
        if self.section == "messages":
            return f"messages[{self.index}].content[{self.block}]"
        return f"{self.section}[{self.index}]"


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """A validated Messages body and what the gateway reads from it."""

    body: dict[str, Any]
    model: str
    stream: bool
    max_tokens: int
    breakpoints: tuple[Breakpoint, ...]

    @property
    def retention_class(self) -> str | None:
        """The longest lifetime any breakpoint asks for (None without breakpoints)."""
        if not self.breakpoints:
            return None
        return TTL_1H if any(bp.ttl == TTL_1H for bp in self.breakpoints) else TTL_5M


def parse_messages_request(raw: bytes, *, count_only: bool = False) -> MessagesRequest:
    """Decode and validate `raw`. `count_only` (for `count_tokens`) does not require `max_tokens`."""
    try:
        body = decode_json_object(raw)
    except RecursionError:
        raise too_deep() from None
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest(
            "model: Field required" if model is None else "model: must be a non-empty string", param="model"
        )
    max_tokens = body.get("max_tokens")
    if not count_only or max_tokens is not None:
        if max_tokens is None:
            raise BadRequest("max_tokens: Field required", param="max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest("max_tokens: must be a positive integer", param="max_tokens")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("stream: must be a boolean", param="stream")
    _check_sampling(body)
    _check_metadata(body.get("metadata"))
    breakpoints: list[Breakpoint] = []
    _check_tools(body.get("tools"), breakpoints)
    _check_tool_choice(body.get("tool_choice"), body.get("tools"))
    _check_system(body.get("system"), breakpoints)
    _check_messages(body.get("messages"), breakpoints)
    if len(breakpoints) > MAX_BREAKPOINTS:
        raise BadRequest(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(breakpoints)}.",
            param="cache_control",
        )
    for earlier, later in zip(breakpoints, breakpoints[1:]):
        if earlier.ttl == TTL_5M and later.ttl == TTL_1H:
            raise BadRequest(
                f"{later.label}.cache_control: a ttl='1h' cache_control block must not come after a ttl='5m' one "
                f"({earlier.label})",
                param="cache_control",
            )
    return MessagesRequest(body, model, stream, max_tokens if isinstance(max_tokens, int) else 0, tuple(breakpoints))


def too_deep() -> BadRequest:
    return BadRequest("The request body is nested too deeply to be processed.")


def _number(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise BadRequest(f"{name}: must be a number between {low:g} and {high:g}", param=name)


def _check_sampling(body: dict[str, Any]) -> None:
    _number(body, "temperature", 0.0, 1.0)
    _number(body, "top_p", 0.0, 1.0)
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise BadRequest("top_k: must be a non-negative integer", param="top_k")
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)):
        raise BadRequest("stop_sequences: must be a list of non-empty strings", param="stop_sequences")


def _check_metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise BadRequest("metadata: must be an object", param="metadata")
    unknown = sorted(set(metadata) - {"user_id"})
    if unknown:
        raise BadRequest(f"metadata.{unknown[0]}: Extra inputs are not permitted", param="metadata")
    user_id = metadata.get("user_id")
    if user_id is not None and not isinstance(user_id, str):
        raise BadRequest("metadata.user_id: must be a string", param="metadata.user_id")


def _cache_control(value: Any, where: str, section: str, index: int, block: int | None, out: list[Breakpoint]) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or value.get("type") != "ephemeral":
        raise BadRequest(f'{where}.cache_control: must be {{"type": "ephemeral"}}', param=f"{where}.cache_control")
    unknown = sorted(set(value) - {"type", "ttl"})
    if unknown:
        raise BadRequest(f"{where}.cache_control.{unknown[0]}: Extra inputs are not permitted", param=where)
    ttl = value.get("ttl", TTL_5M)
    if ttl not in TTLS:
        raise BadRequest(
            f"{where}.cache_control.ttl: must be '5m' or '1h', not {ttl!r}", param=f"{where}.cache_control"
        )
    out.append(Breakpoint(section, index, block, ttl))


def _check_tools(tools: Any, out: list[Breakpoint]) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise BadRequest("tools: must be a list", param="tools")
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise BadRequest(f"{where}: must be an object", param=where)
        kind = tool.get("type", "custom")
        if kind != "custom":
            raise BadRequest(
                f"{where}: tools of type {kind!r} (server or client tools run by Anthropic) are not supported by this "
                "gateway; define a custom tool with name and input_schema",
                param=where,
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise BadRequest(f"{where}.name: Field required", param=f"{where}.name")
        if not isinstance(tool.get("input_schema"), dict):
            raise BadRequest(f"{where}.input_schema: Field required (a JSON schema object)", param=where)
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise BadRequest(f"{where}.description: must be a string", param=where)
        _cache_control(tool.get("cache_control"), where, "tools", index, None, out)


def _check_tool_choice(choice: Any, tools: Any) -> None:
    if choice is None:
        return
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise BadRequest("tool_choice.type: must be one of 'auto', 'any', 'tool', 'none'", param="tool_choice")
    if kind == "tool":
        name = choice.get("name")
        names = {t.get("name") for t in tools or () if isinstance(t, dict)}
        if not isinstance(name, str) or name not in names:
            raise BadRequest(f"tool_choice.name: {name!r} is not one of the tools in the request", param="tool_choice")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise BadRequest("tool_choice.disable_parallel_tool_use: must be a boolean", param="tool_choice")


def _unsupported(where: str, kind: Any) -> BadRequest:
    return BadRequest(
        f"{where}: content blocks of type {kind!r} are not supported by this gateway "
        "(supported: text, tool_use, tool_result; image, document and thinking blocks are not)",
        param=where,
    )


def _check_text_block(block: dict[str, Any], where: str) -> None:
    if not isinstance(block.get("text"), str):
        raise BadRequest(f"{where}.text: Field required (a string)", param=where)


def _check_system(system: Any, out: list[Breakpoint]) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise BadRequest("system: must be a string or a list of text blocks", param="system")
    for index, block in enumerate(system):
        where = f"system[{index}]"
        if not isinstance(block, dict):
            raise BadRequest(f"{where}: must be an object", param=where)
        if block.get("type") != "text":
            raise _unsupported(where, block.get("type"))
        _check_text_block(block, where)
        _cache_control(block.get("cache_control"), where, "system", index, None, out)


def _check_messages(messages: Any, out: list[Breakpoint]) -> None:
    if messages is None:
        raise BadRequest("messages: Field required", param="messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: must be a non-empty list", param="messages")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{where}: must be an object", param=where)
        role = message.get("role")
        if role not in _ROLES:
            raise BadRequest(f"{where}.role: must be 'user' or 'assistant'", param=f"{where}.role")
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise BadRequest(f"{where}.content: must be a string or a list of blocks", param=f"{where}.content")
        allowed = _USER_BLOCKS if role == "user" else _ASSISTANT_BLOCKS
        for block_index, block in enumerate(content):
            block_where = f"{where}.content[{block_index}]"
            if not isinstance(block, dict):
                raise BadRequest(f"{block_where}: must be an object", param=block_where)
            kind = block.get("type")
            if kind not in allowed:
                if kind in _USER_BLOCKS | _ASSISTANT_BLOCKS:
                    raise BadRequest(
                        f"{block_where}: {kind!r} blocks are not allowed in {role} messages", param=block_where
                    )
                raise _unsupported(block_where, kind)
            if kind == "text":
                _check_text_block(block, block_where)
            elif kind == "tool_use":
                _check_tool_use(block, block_where)
            else:
                _check_tool_result(block, block_where)
            _cache_control(block.get("cache_control"), block_where, "messages", index, block_index, out)


def _check_tool_use(block: dict[str, Any], where: str) -> None:
    for name in ("id", "name"):
        if not isinstance(block.get(name), str) or not block[name]:
            raise BadRequest(f"{where}.{name}: Field required", param=where)
    if not isinstance(block.get("input"), dict):
        raise BadRequest(f"{where}.input: must be an object", param=where)


def _check_tool_result(block: dict[str, Any], where: str) -> None:
    if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
        raise BadRequest(f"{where}.tool_use_id: Field required", param=where)
    content = block.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: must be a string or a list of blocks", param=where)
    for index, part in enumerate(content):
        part_where = f"{where}.content[{index}]"
        if not isinstance(part, dict):
            raise BadRequest(f"{part_where}: must be an object", param=part_where)
        if part.get("type") not in _TOOL_RESULT_BLOCKS:
            raise _unsupported(part_where, part.get("type"))
        _check_text_block(part, part_where)
