"""The engine's OpenAPI 3.1 description, served at `GET /openapi.json`: every request body field it reads, with
the type and range it accepts (an explicit `null` is always allowed for an optional field and means "absent").

Field semantics follow OpenAI's API reference (Chat Completions and Completions); the extras are vLLM's
`cache_salt` and this engine's `cache_retention`, `return_hash_chain`, `hash_block_size` and `ignore_eos`.
"""

from __future__ import annotations

from local_engine.hash_chain import MAX_BLOCK_SIZE
from local_engine.cache.tiers import RETENTION_CLASSES


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
_STOP = nullable({"anyOf": [{"type": "string", "minLength": 1},
                            {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4}]})
_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_TOOL_CALL = {
    "type": "object",
    "required": ["function"],
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1}, "arguments": {"type": "string"}},
        },
    },
}
MESSAGE = {
    "type": "object",
    "required": ["role"],
    "description": "content may be null only for an assistant message; tool_calls only on assistant messages",
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": nullable({"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]}),
        "name": nullable({"type": "string"}),
        "tool_calls": nullable({"type": "array", "items": _TOOL_CALL}),
        "tool_call_id": nullable({"type": "string"}),
    },
}
TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,64}$"},
                "description": nullable({"type": "string"}),
                "parameters": nullable({"type": "object"}),
                "strict": nullable({"type": "boolean"}),
            },
        },
    },
}
TOOL_CHOICE = nullable({"anyOf": [
    {"enum": ["auto", "none", "required"]},
    {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}},
]})
_COMMON = {
    "model": {"type": "string", "minLength": 1},
    "temperature": nullable({"type": "number", "minimum": 0, "maximum": 2}),
    "top_p": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
    "seed": nullable(INT64),
    "stop": _STOP,
    "stream": nullable({"type": "boolean"}),
    "stream_options": nullable({"type": "object", "properties": {"include_usage": nullable({"type": "boolean"})},
                                "description": "only with stream: true"}),
    "n": nullable({"type": "integer", "minimum": 1, "maximum": 16,
                   "description": "sequences returned, forked from one prefill; sequence i samples with seed + i"}),
    "presence_penalty": nullable({"type": "number", "minimum": -2, "maximum": 2}),
    "frequency_penalty": nullable({"type": "number", "minimum": -2, "maximum": 2}),
    "repetition_penalty": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 100,
                                    "description": "vLLM's: seen tokens' logits divided (positive) or multiplied"}),
    "min_tokens": nullable({"type": "integer", "minimum": 0, "description": "vLLM's: no EOS before this many"}),
    "logit_bias": nullable({"type": "object", "maxProperties": 1024,
                            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
                            "description": "token id (as a string) -> bias added to its logit"}),
    "response_format": nullable({"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["text", "json_object", "json_schema"]},
        "json_schema": {"type": "object", "properties": {"name": {"type": "string"}, "schema": {"type": "object"},
                                                         "strict": nullable({"type": "boolean"})}},
    }, "description": "constrained decoding (llguidance); a schema that does not compile is a 400"}),
    "user": nullable({"type": "string"}),
    "cache_salt": nullable({"type": "string", "maxLength": 1000}),
    "cache_retention": nullable({
        "enum": list(RETENTION_CLASSES),
        "description": "how long this prompt's KV stays cached once idle, in every tier (device, host, disk): "
                       "5m and 1h expire after that idle time, persistent never expires and is evicted last; "
                       "default: the engine's --ttl",
    }),
    "return_hash_chain": nullable({"type": "boolean"}),
    "hash_block_size": nullable({"type": "integer", "minimum": 1, "maximum": MAX_BLOCK_SIZE}),
    "ignore_eos": nullable({"type": "boolean"}),
}
CHAT_REQUEST = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        **_COMMON,
        "messages": {"type": "array", "items": MESSAGE, "minItems": 1},
        "tools": nullable({"type": "array", "items": TOOL}),
        "tool_choice": TOOL_CHOICE,
        "parallel_tool_calls": nullable({"type": "boolean"}),
        "max_tokens": nullable({"type": "integer", "minimum": 1,
                                "description": "default: the rest of the context window"}),
        "max_completion_tokens": nullable({"type": "integer", "minimum": 1, "description": "wins over max_tokens"}),
        "logprobs": nullable({"type": "boolean"}),
        "top_logprobs": nullable({"type": "integer", "minimum": 0, "maximum": 20, "description": "needs logprobs"}),
        "metadata": nullable({"type": "object"}),
        "store": nullable({"type": "boolean"}),
    },
}
COMPLETION_REQUEST = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        **_COMMON,
        "prompt": {"anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
            {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
            {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}},
             "minItems": 1, "maxItems": 1},
        ]},
        "max_tokens": nullable({"type": "integer", "minimum": 0, "description": "default: 16; 0 only with echo"}),
        "echo": nullable({"type": "boolean", "description": "with logprobs, the prompt is computed whole (not cached)"}),
        "best_of": nullable({"type": "integer", "minimum": 1, "maximum": 16,
                             "description": "at least n; the n most likely returned; not streamed when above n"}),
        "suffix": nullable({"const": ""}),
        "logprobs": nullable({"type": "integer", "minimum": 0, "maximum": 20}),
    },
}
ERROR = {
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


def _post(summary: str, schema_ref: str) -> dict:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": schema_ref}}}},
        "responses": _responses(),
    }}


def _responses() -> dict:
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {
        "200": {"description": "OK (JSON, or server-sent events when stream is true)"},
        "400": {"description": "invalid request; error.param names the field", **error},
        "404": {"description": "the model is not served here (error.code model_not_found)", **error},
        "503": {"description": "overloaded or stopping", **error},
    }


def _get(summary: str, parameters: list | None = None) -> dict:
    operation = {"summary": summary, "responses": {"200": {"description": "OK"}}}
    if parameters:
        operation["parameters"] = parameters
    return {"get": operation}


def openapi_document() -> dict:
    match_body = {"anyOf": [{"$ref": "#/components/schemas/ChatCompletionRequest"},
                            {"$ref": "#/components/schemas/CompletionRequest"}]}
    return {
        "openapi": "3.1.0",
        "info": {"title": "prefixscope engine", "version": "1"},
        "paths": {
            "/v1/chat/completions": _post("Chat completion", "#/components/schemas/ChatCompletionRequest"),
            "/v1/completions": _post("Text completion", "#/components/schemas/CompletionRequest"),
            "/v1/cache/match": {"post": {
                "summary": "Dry-run prefix match of a chat or completions body",
                "requestBody": {"required": True, "content": {"application/json": {"schema": match_body}}},
                "responses": _responses(),
            }},
            "/v1/cache/tree": _get("Radix tree snapshot", [{
                "name": "max_nodes", "in": "query", "required": False,
                "schema": {"type": "integer", "minimum": 1}}]),
            "/v1/cache": _get("Cache statistics"),
            "/v1/cache/flush": {"post": {"summary": "Flush the cache (admin token)", "responses": _responses()}},
            "/v1/cache/events": _get("The KV-event stream's retained batches (as published over ZeroMQ)", [
                {"name": "after", "in": "query", "required": False, "schema": {"type": "integer", "minimum": -1}},
                {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}}]),
            "/v1/tokenizer": _get("The served model's tokenizer.json, chat template and special tokens"),
            "/v1/models": _get("Served model"),
            "/health": {"get": {"summary": "Health", "responses": {
                "200": {"description": "ready: warmed up and serving"},
                "503": {"description": "starting: the warm-up before ready is still running"}}}},
            "/metrics": _get("Prometheus metrics"),
        },
        "components": {"schemas": {
            "ChatCompletionRequest": CHAT_REQUEST,
            "CompletionRequest": COMPLETION_REQUEST,
            "Error": ERROR,
        }},
    }
