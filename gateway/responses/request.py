"""Parsing a Responses API request body: the fields the gateway itself reads, checked for every upstream.

Source of the field names and types: OpenAI's API reference, "Responses: create" (`openai.types.responses.
response_create_params`). Read here: `model`, `input` (a string or a list of items), `instructions`, `stream`, `store`
(default true), `previous_response_id`, `prompt_cache_key`, `prompt_cache_retention` (`in_memory` | `24h`) and the
gateway's own `cache_retention`. What a chat upstream can be asked for is checked item by item when the request is
translated (`gateway.responses.translate`); an OpenAI upstream gets the rest unchanged. Bad input raises
`gateway.errors.BadRequest` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.errors import BadRequest
from gateway.parsing import decode_json_object
from gateway.retention import requested_retention

PROMPT_CACHE_RETENTIONS = ("in_memory", "24h")
# OpenAI's `prompt_cache_retention` as a prefixscope retention class (`gateway.retention`), for upstreams that take
# one: in-memory caching lasts minutes; an extended (24h) prefix is kept as long as the tenant's ceiling allows.
RETENTION_FOR_PROMPT_CACHE = {"in_memory": "5m", "24h": "persistent"}


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A Responses body and what the gateway reads from it (`retention_class`: the prefixscope class asked for,
    from `cache_retention` or else `prompt_cache_retention`, before the tenant's ceiling)."""

    body: dict[str, Any]
    model: str
    stream: bool
    store: bool
    previous_response_id: str | None
    retention_class: str | None


def _optional_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be a boolean.", param=name)
    return value


def _optional_string(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"'{name}' must be a string.", param=name)
    return value


def parse_responses_request(raw: bytes) -> ResponsesRequest:
    """Decode and check `raw` (see the module docstring). Raises `BadRequest`."""
    body = decode_json_object(raw)
    model = body.get("model")
    if model is None:
        raise BadRequest("Missing required parameter: 'model'.", param="model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string.", param="model")
    value = body.get("input")
    if value is None:
        raise BadRequest("Missing required parameter: 'input'.", param="input")
    if not isinstance(value, str | list) or (isinstance(value, list) and not value):
        raise BadRequest("'input' must be a string or a non-empty array of input items.", param="input")
    if isinstance(value, list):
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                raise BadRequest(f"input[{index}] must be an object.", param=f"input[{index}]")
    _optional_string(body, "instructions")
    previous = _optional_string(body, "previous_response_id")
    if previous == "":
        raise BadRequest("'previous_response_id' must not be empty.", param="previous_response_id")
    _optional_string(body, "prompt_cache_key")
    retention = body.get("prompt_cache_retention")
    if retention is not None and retention not in PROMPT_CACHE_RETENTIONS:
        raise BadRequest(
            f"Invalid value for 'prompt_cache_retention': {str(retention)[:40]!r}. Supported values are: "
            + ", ".join(f"'{name}'" for name in PROMPT_CACHE_RETENTIONS)
            + ".",
            param="prompt_cache_retention",
            code="invalid_value",
        )
    retention_class = requested_retention(body)
    if retention_class is None and retention is not None:
        retention_class = RETENTION_FOR_PROMPT_CACHE[retention]
    return ResponsesRequest(
        body=body,
        model=model,
        stream=_optional_bool(body, "stream", False),
        store=_optional_bool(body, "store", True),
        previous_response_id=previous,
        retention_class=retention_class,
    )
