"""The gateway's OpenAPI 3.1 description, served at `GET /openapi.json`.

The completions endpoints are raw ASGI handlers (the hot path), so they are described here by hand: the fields the
gateway itself reads and checks, with everything else passed through to the upstream (which validates it and whose
400 comes back unchanged). An explicit `null` for an optional field means "absent". The Messages API endpoints
(`/v1/messages`, `/v1/messages/count_tokens`) are described with the fields `gateway.anthropic.request` reads, and
answer errors in Anthropic's shape (`AnthropicError`); the Responses API (`/v1/responses`) with the fields
`gateway.responses` reads.
"""

from __future__ import annotations

from typing import Any

from db.conversation_window import CONVERSATIONS_DEFAULT_SINCE
from db.records import RETENTION_CLASSES


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
    "cache_retention": {
        **_nullable({"enum": list(RETENTION_CLASSES)}),
        "description": "how long the engine keeps the prompt's cached prefix; lowered to the tenant's "
        "max_cache_retention (the applied class comes back in x-prefixscope-cache-retention), absent: the tenant's "
        "cache_retention; sent only to upstreams that take it (the local engine)",
    },
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
    "repetition_penalty": _passed(_NUMBER),
    "min_tokens": _passed(_INTEGER),
    "response_format": _passed(_OBJECT),
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

# --- the Anthropic Messages API (`gateway.anthropic`) -----------------------------------------------------------------
_CACHE_CONTROL = _nullable({
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"const": "ephemeral"}, "ttl": {"enum": ["5m", "1h"]}},
    "description": "a breakpoint: the prefix up to this block is cached (at most 4 per request; tools -> system -> "
                   "messages; a 1h breakpoint may not follow a 5m one)",
})
_TEXT_BLOCK: dict[str, Any] = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": _STRING, "cache_control": _CACHE_CONTROL},
}
_CONTENT_BLOCK: dict[str, Any] = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"enum": ["text", "tool_use", "tool_result"]},
        "text": _STRING,
        "id": _STRING,
        "name": _STRING,
        "input": _OBJECT,
        "tool_use_id": _STRING,
        "content": {"anyOf": [_STRING, {"type": "array", "items": _TEXT_BLOCK}, {"type": "null"}]},
        "is_error": _nullable(_BOOLEAN),
        "cache_control": _CACHE_CONTROL,
    },
    "description": "text, tool_use (assistant) and tool_result (user) blocks; image, document and thinking blocks "
                   "are refused with a 400 naming them",
}
_MESSAGES_COMMON: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1},
    "messages": {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"enum": ["user", "assistant"]},
                "content": {"anyOf": [_STRING, {"type": "array", "items": _CONTENT_BLOCK}]},
            },
        },
    },
    "system": _nullable({"anyOf": [_STRING, {"type": "array", "items": _TEXT_BLOCK}]}),
    "tools": _nullable({"type": "array", "items": {
        "type": "object",
        "required": ["name", "input_schema"],
        "properties": {"name": _STRING, "description": _STRING, "input_schema": _OBJECT,
                       "cache_control": _CACHE_CONTROL},
        "description": "custom tools only; Anthropic's server and client tools are refused",
    }}),
    "tool_choice": _nullable({
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"enum": ["auto", "any", "tool", "none"]}, "name": _STRING,
                       "disable_parallel_tool_use": _nullable(_BOOLEAN)},
    }),
    "thinking": _nullable({**_OBJECT, "description": "refused on chat upstreams (the local engine)"}),
}
_MESSAGES_PASS_THROUGH = "To an upstream of kind anthropic the normalized body passes through; to a chat upstream " \
    "it is translated to the chat API. An explicit null for an optional field means absent."
MESSAGES_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages", "max_tokens"],
    "additionalProperties": True,
    "description": _MESSAGES_PASS_THROUGH,
    "properties": {
        **_MESSAGES_COMMON,
        "max_tokens": {"type": "integer", "minimum": 1},
        "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "top_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "top_k": _nullable({"type": "integer", "minimum": 0}),
        "stop_sequences": _nullable({"type": "array", "items": {"type": "string", "minLength": 1}}),
        "metadata": _nullable({"type": "object", "properties": {"user_id": _nullable(_STRING)}}),
        "stream": _nullable(_BOOLEAN),
    },
}
COUNT_TOKENS_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "additionalProperties": True,
    "description": _MESSAGES_PASS_THROUGH + " Counting is not recorded.",
    "properties": dict(_MESSAGES_COMMON),
}
ANTHROPIC_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": _STRING, "message": _STRING},
        },
    },
}
_ANTHROPIC_ERROR_REF = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/AnthropicError"}}}}
_ANTHROPIC_AUTH = [{"apiKey": []}, {"bearer": []}]


def _messages(summary: str, schema: str, ok: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "security": _ANTHROPIC_AUTH,
        "parameters": [{"name": "anthropic-version", "in": "header", "required": False, "schema": _STRING}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": schema}}}},
        "responses": {
            "200": {"description": ok},
            "400": {"description": "invalid_request_error: the request cannot be served", **_ANTHROPIC_ERROR_REF},
            "401": {"description": "authentication_error: missing or unknown API key", **_ANTHROPIC_ERROR_REF},
            "404": {"description": "not_found_error: the model is not served (message `model: <name>`)",
                    **_ANTHROPIC_ERROR_REF},
            "413": {"description": "request_too_large: body over the configured limit", **_ANTHROPIC_ERROR_REF},
            "502": {"description": "api_error: upstream unreachable or failing", **_ANTHROPIC_ERROR_REF},
            "504": {"description": "api_error: upstream timed out", **_ANTHROPIC_ERROR_REF},
        },
    }}


RESPONSES_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "input"],
    "description": "OpenAI's Responses API (docs/apis.md). To chat upstreams it is translated into a chat completion "
    "and what a chat upstream cannot honour is a 400 naming the field; to openai upstreams it passes through.",
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "object"}}]},
        "instructions": _nullable({"type": "string"}),
        "previous_response_id": _nullable({"type": "string", "minLength": 1,
                                           "description": "a response this tenant created with store true"}),
        "store": _nullable({"type": "boolean", "description": "default true: kept for previous_response_id and GET"}),
        "stream": _nullable({"type": "boolean"}),
        "tools": _nullable({"type": "array", "items": {"type": "object"}}),
        "tool_choice": _nullable({"anyOf": [{"enum": ["auto", "none", "required"]}, {"type": "object"}]}),
        "text": _nullable({"type": "object", "description": "text.format json_schema / json_object / text"}),
        "max_output_tokens": _nullable({"type": "integer", "minimum": 1}),
        "temperature": _nullable({"type": "number"}),
        "top_p": _nullable({"type": "number"}),
        "prompt_cache_key": _nullable({"type": "string", "description": "replaced by the gateway's own per tenant "
                                                                       "and prefix (openai upstreams only)"}),
        "prompt_cache_retention": _nullable({"enum": ["in_memory", "24h"]}),
        "cache_retention": _nullable({"enum": list(RETENTION_CLASSES)}),
    },
}


def _response_by_id() -> dict[str, Any]:
    parameters = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    responses = {"200": {"description": "OK"}, "404": {"description": "not kept for this API key", **_ERROR_REF}}
    return {
        "get": {"summary": "A kept response", "security": _AUTH, "parameters": parameters, "responses": responses},
        "delete": {"summary": "Forget a kept response", "security": _AUTH, "parameters": parameters,
                   "responses": responses},
    }


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
            "404": {"description": "the upstream serves no such model (error.code model_not_found)", **_ERROR_REF},
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
            "/v1/responses": _completions("OpenAI Responses API", "#/components/schemas/ResponsesRequest"),
            "/v1/responses/{response_id}": _response_by_id(),
            "/v1/messages": _messages(
                "Anthropic Messages API", "#/components/schemas/MessagesRequest",
                "a message in Anthropic's shape (JSON, or Anthropic's server-sent events when stream is true); "
                "every response carries x-request-id and request-id",
            ),
            "/v1/messages/count_tokens": _messages(
                "Anthropic token count", "#/components/schemas/CountTokensRequest", '{"input_tokens": N}'
            ),
            "/v1/models": {"get": {"summary": "Models of the upstreams", "security": _AUTH,
                                   "responses": {"200": {"description": "OK"}}}},
            "/api/stats": {"get": {
                "summary": "Request history", "security": _AUTH, "parameters": stats_parameters,
                "responses": {"200": {"description": "OK"},
                              "400": {"description": "a parameter is not usable; error.param names it", **_ERROR_REF},
                              "403": {"description": "another tenant's statistics", **_ERROR_REF}},
            }},
            "/api/conversations": {"get": {
                "summary": "Conversations, worst first (most tokens lost)", "security": _AUTH,
                "parameters": [_query("since", "a duration before now (24h, 7d), 'now' or an ISO 8601 time; default "
                                          f"{CONVERSATIONS_DEFAULT_SINCE}"),
                               stats_parameters[1], stats_parameters[4],
                               _query("limit", "1-1000; default 100", {"type": "integer", "minimum": 1,
                                                                       "maximum": 1000})],
                "responses": {"200": {"description": "OK"},
                              "400": {"description": "a parameter is not usable; error.param names it", **_ERROR_REF},
                              "403": {"description": "another tenant's conversations", **_ERROR_REF}},
            }},
            "/api/conversations/{conversation_id}": {"get": {
                "summary": "One conversation's turns, each with its token ledger", "security": _AUTH,
                "parameters": [{"name": "conversation_id", "in": "path", "required": True,
                                "schema": {"type": "string", "maxLength": 64}}, stats_parameters[4]],
                "responses": {"200": {"description": "OK"},
                              "404": {"description": "no such conversation (or another tenant's)", **_ERROR_REF}},
            }},
            "/health": {"get": {"summary": "Health", "responses": {
                "200": {"description": "OK"},
                "503": {"description": "degraded, for the stated reason: every request is refused, or the default "
                                       "upstream has no replica in rotation"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "OK"}}}},
        },
        "components": {
            "schemas": {"ChatCompletionRequest": CHAT_REQUEST, "CompletionRequest": COMPLETION_REQUEST,
                        "Error": ERROR, "MessagesRequest": MESSAGES_REQUEST, "ResponsesRequest": RESPONSES_REQUEST,
                        "CountTokensRequest": COUNT_TOKENS_REQUEST, "AnthropicError": ANTHROPIC_ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
        },
    }
