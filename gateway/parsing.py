"""Parse and validate an incoming completions request body (bad input -> `BadRequest`, never a 500)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.body_checks import undecodable_body
from gateway.errors import BadRequest
from gateway.retention import requested_retention

CHAT = "chat.completions"
COMPLETIONS = "completions"
RESPONSES = "responses"  # the Responses API (`gateway.responses`), recorded as its own endpoint
ENDPOINTS = (CHAT, COMPLETIONS)

_DECODER = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    endpoint: str
    body: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool  # the client itself asked for `stream_options.include_usage`
    cache_retention: str | None = None  # the retention class the client asked for (`gateway.retention`), if any


def decode_json_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise BadRequest("The request body is empty; expected a JSON object.")
    try:
        body = _DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        raise undecodable_body(raw, str(exc)) from None
    except RecursionError:
        raise undecodable_body(raw, "nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    return body


def parse_request(endpoint: str, raw: bytes) -> ParsedRequest:
    """Decode `raw` and check the fields the gateway relies on; the rest is left to the upstream."""
    body = decode_json_object(raw)
    model = body.get("model")
    if model is None:
        raise BadRequest("you must provide a model parameter", param="model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a non-empty string", param="model")
    if endpoint == CHAT:
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body)
    stream = body.get("stream")
    if stream is None:
        stream = False  # an explicit null is the same as leaving the field out
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", param="stream_options")
    include_usage = options.get("include_usage") if options else None
    if include_usage is not None and not isinstance(include_usage, bool):
        raise BadRequest("stream_options.include_usage must be a boolean", param="stream_options.include_usage")
    wants_usage = include_usage is True
    return ParsedRequest(endpoint, body, model, stream, wants_usage, requested_retention(body))


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise BadRequest("Missing required parameter: 'messages'.", param="messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array.", param="messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{index}] must be an object.", param=f"messages[{index}]")
        if not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{index}].role must be a string.", param=f"messages[{index}].role")


def _check_prompt(body: dict[str, Any]) -> None:
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("Missing required parameter: 'prompt'.", param="prompt")
    if not isinstance(prompt, str | list):
        raise BadRequest("'prompt' must be a string or an array.", param="prompt")
    if isinstance(prompt, list) and not prompt:
        raise BadRequest("'prompt' must not be an empty array.", param="prompt")
