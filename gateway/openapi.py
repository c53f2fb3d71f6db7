"""The gateway's OpenAPI 3.1 description, served at `GET /openapi.json`.

The completions endpoints are raw ASGI handlers (the hot path), so they are described here by hand: the fields the
gateway itself reads and checks, with everything else passed through to the upstream (which validates it and whose
400 comes back unchanged). An explicit `null` for an optional field means "absent".
"""

from __future__ import annotations

from typing import Any


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


_PASS_THROUGH = "Fields the gateway does not read go to the upstream unchanged (its 400 comes back as is), except " \
    "client cache salts (cache_salt, salt, extra_key, prompt_cache_key), which the gateway replaces with the tenant's."
_COMMON: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1},
    "stream": _nullable({"type": "boolean"}),
    "stream_options": _nullable({
        "type": "object",
        "properties": {"include_usage": _nullable({"type": "boolean"})},
        "description": "usage is sent on the stream only when include_usage is true",
    }),
    "return_hash_chain": _nullable({"type": "boolean"}),
}


def _passed(schema: dict[str, Any], note: str = "passed to the upstream, which validates it") -> dict[str, Any]:
    return {**_nullable(schema), "description": note}


_NUMBER, _INTEGER, _STRING, _BOOLEAN, _OBJECT = (
    {"type": "number"}, {"type": "integer"}, {"type": "string"}, {"type": "boolean"}, {"type": "object"})
# OpenAI's sampling and output fields, common to both endpoints; the gateway reads none of them.
_UPSTREAM_COMMON: dict[str, Any] = {
    "max_tokens": _passed(_INTEGER),
    "temperature": _passed(_NUMBER),
    "top_p": _passed(_NUMBER),
    "seed": _passed(_INTEGER),
    "stop": _passed({"anyOf": [_STRING, {"type": "array", "items": _STRING}]}),
    "n": _passed(_INTEGER),
    "presence_penalty": _passed(_NUMBER),
    "frequency_penalty": _passed(_NUMBER),
    "logit_bias": _passed(_OBJECT),
    "user": _passed(_STRING),
    "cache_salt": _passed(_STRING, "replaced by the tenant's salt (so are salt, extra_key and prompt_cache_key)"),
    "hash_block_size": _passed(_INTEGER),
    "ignore_eos": _passed(_BOOLEAN),
}
_UPSTREAM_CHAT: dict[str, Any] = {
    **_UPSTREAM_COMMON,
    "max_completion_tokens": _passed(_INTEGER),
    "tools": _passed({"type": "array", "items": _OBJECT}, "normalized (key order, tool order), then passed on"),
    "tool_choice": _passed({"anyOf": [_STRING, _OBJECT]}),
    "parallel_tool_calls": _passed(_BOOLEAN),
    "logprobs": _passed(_BOOLEAN),
    "top_logprobs": _passed(_INTEGER),
    "response_format": _passed(_OBJECT),
    "metadata": _passed(_OBJECT),
    "store": _passed(_BOOLEAN),
}
_UPSTREAM_COMPLETIONS: dict[str, Any] = {
    **_UPSTREAM_COMMON,
    "echo": _passed(_BOOLEAN),
    "best_of": _passed(_INTEGER),
    "suffix": _passed(_STRING),
    "logprobs": _passed(_INTEGER),
}
CHAT_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "additionalProperties": True,
    "description": _PASS_THROUGH,
    "properties": {
        **_UPSTREAM_CHAT,
        **_COMMON,
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "object", "required": ["role"], "properties": {"role": {"type": "string"}}},
        },
    },
}
COMPLETION_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "prompt"],
    "additionalProperties": True,
    "description": _PASS_THROUGH,
    "properties": {
        **_UPSTREAM_COMPLETIONS,
        **_COMMON,
        "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1}]},
    },
}
ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"type": ["string", "null"]},
            "code": {"type": ["string", "null"]},
        },
    }},
}
_ERROR_REF = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_AUTH = [{"bearer": []}]


def _completions(summary: str, schema: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "security": _AUTH,
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": schema}}}},
        "responses": {
            "200": {"description": "the upstream's answer (JSON, or server-sent events when stream is true); "
                                   "every response carries x-request-id"},
            "400": {"description": "invalid request; error.param names the field", **_ERROR_REF},
            "401": {"description": "missing or unknown API key", **_ERROR_REF},
            "413": {"description": "body over the configured limit", **_ERROR_REF},
            "502": {"description": "upstream unreachable", **_ERROR_REF},
            "504": {"description": "upstream timed out", **_ERROR_REF},
        },
    }}


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema or {"type": "string", "maxLength": 200}}


def openapi_document() -> dict[str, Any]:
    stats_parameters = [
        _query("since", "a duration before now (24h, 7d), 'now' or an ISO 8601 time; default 24h"),
        _query("until", "as since; default now"),
        _query("bucket", "1h, 1d, ...; default 1h"),
        _query("group_by", "tenant, model or upstream", {"enum": ["tenant", "model", "upstream"]}),
        _query("tenant", "one tenant (admin keys only; a tenant key sees its own)"),
    ]
    return {
        "openapi": "3.1.0",
        "info": {"title": "prefixscope gateway", "version": "1"},
        "paths": {
            "/v1/chat/completions": _completions("Chat completion", "#/components/schemas/ChatCompletionRequest"),
            "/v1/completions": _completions("Text completion", "#/components/schemas/CompletionRequest"),
            "/v1/models": {"get": {"summary": "Models of the upstreams", "security": _AUTH,
                                   "responses": {"200": {"description": "OK"}}}},
            "/api/stats": {"get": {
                "summary": "Request history", "security": _AUTH, "parameters": stats_parameters,
                "responses": {"200": {"description": "OK"},
                              "400": {"description": "a parameter is not usable; error.param names it", **_ERROR_REF},
                              "403": {"description": "another tenant's statistics", **_ERROR_REF}},
            }},
            "/health": {"get": {"summary": "Health", "responses": {
                "200": {"description": "OK"},
                "503": {"description": "degraded: every request is refused, for the stated reason"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "OK"}}}},
        },
        "components": {
            "schemas": {"ChatCompletionRequest": CHAT_REQUEST, "CompletionRequest": COMPLETION_REQUEST,
                        "Error": ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
