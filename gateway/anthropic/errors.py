"""Anthropic-shaped error bodies: `{"type": "error", "error": {"type": ..., "message": ...}}`.

Source of the shape and the type names: Anthropic's API reference, "Errors" (HTTP 400 `invalid_request_error`, 401
`authentication_error`, 403 `permission_error`, 404 `not_found_error`, 413 `request_too_large`, 429
`rate_limit_error`, 500 `api_error`, 529 `overloaded_error`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.errors import GatewayError

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()

_MODEL_SHOWN_CHARS = 200  # a longer model name is cut in error messages

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type_for_status(status_code: int) -> str:
    """The Anthropic error type for an HTTP status (`api_error` for anything unlisted)."""
    return _TYPE_BY_STATUS.get(status_code, "invalid_request_error" if 400 <= status_code < 500 else "api_error")


def anthropic_error_body(message: str, error_type: str) -> bytes:
    return _ENCODER.encode({"type": "error", "error": {"type": error_type, "message": message}})


def body_for_gateway_error(exc: GatewayError) -> bytes:
    """A gateway error in Anthropic's shape; the status code stays the error's own."""
    return anthropic_error_body(exc.message, error_type_for_status(exc.status_code))


def translate_upstream_error(status_code: int, body: bytes, model: str) -> tuple[int, bytes]:
    """An OpenAI-shaped upstream error body (from the engine or an OpenAI-compatible server) as Anthropic's status
    and body, keeping its message; a body that is not OpenAI-shaped is summarised.

    An unknown model (code `model_not_found`, or a 404 naming the `model` parameter) is answered as Anthropic
    answers one: HTTP 404, `not_found_error`, message `model: <name>` (`model` is the name the request gave)."""
    message = f"The upstream answered HTTP {status_code}."
    try:
        decoded: Any = _DECODER.decode(body)
    except msgspec.DecodeError:
        decoded = None
    if isinstance(decoded, dict):
        error = decoded.get("error")
        if isinstance(error, dict) and _is_model_not_found(status_code, error):
            return 404, anthropic_error_body(model_not_found_message(model), "not_found_error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = error["message"]
            param = error.get("param")
            if isinstance(param, str) and param and param not in message:
                message = f"{message} (upstream parameter: {param})"
        elif isinstance(error, str):
            message = error
    return status_code, anthropic_error_body(message, error_type_for_status(status_code))


def _is_model_not_found(status_code: int, error: dict[str, Any]) -> bool:
    return error.get("code") == "model_not_found" or (status_code == 404 and error.get("param") == "model")


def model_not_found_message(model: str) -> str:
    """Anthropic's message for an unknown model, `model: <name>` (a name over `_MODEL_SHOWN_CHARS` cut)."""
    shown = model if len(model) <= _MODEL_SHOWN_CHARS else model[:_MODEL_SHOWN_CHARS] + "..."
    return f"model: {shown}"
