"""The gateway's one exception hierarchy and its mapping to OpenAI-shaped error bodies.

Every failure the gateway itself detects is a `GatewayError`; the HTTP edge turns it into
`{"error": {"message", "type", "param", "code"}}` with the error's status code, and the recorder stores its
`error_type`.
"""

from __future__ import annotations

import msgspec


class GatewayError(Exception):
    """Base of every error the gateway reports to a client."""

    status_code: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> bytes:
        """The OpenAI-shaped JSON error body."""
        return error_body(self.message, self.error_type, self.param, self.code)


class BadRequest(GatewayError):
    """Malformed JSON or a missing/invalid field."""

    status_code = 400
    error_type = "invalid_request_error"


class Unauthorized(GatewayError):
    """No key, an unknown key or a revoked key."""

    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(GatewayError):
    """An authenticated caller asked for data it may not see (another tenant's)."""

    status_code = 403
    error_type = "permission_error"


class NotFound(GatewayError):
    status_code = 404
    error_type = "not_found_error"


class MethodNotAllowed(GatewayError):
    status_code = 405
    error_type = "invalid_request_error"


class PayloadTooLarge(GatewayError):
    """The request body is over the configured limit."""

    status_code = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class UpstreamUnavailable(GatewayError):
    """The upstream could not be reached or broke the connection."""

    status_code = 502
    error_type = "upstream_unavailable"


class UpstreamTimeout(GatewayError):
    """The upstream did not answer within its configured timeout."""

    status_code = 504
    error_type = "upstream_timeout"


class ServiceUnavailable(GatewayError):
    """The gateway cannot serve yet (for instance, API keys could not be loaded at start-up)."""

    status_code = 503
    error_type = "service_unavailable"


class ClientDisconnected(GatewayError):
    """The client went away before the response was complete (recorded with nginx's 499; never sent)."""

    status_code = 499
    error_type = "client_disconnected"


class ConfigError(Exception):
    """The gateway's configuration file or options are invalid (raised at start-up, never per request)."""


_ENCODER = msgspec.json.Encoder()


def error_body(message: str, error_type: str, param: str | None = None, code: str | None = None) -> bytes:
    """Serialise an OpenAI-shaped error body."""
    return _ENCODER.encode({"error": {"message": message, "type": error_type, "param": param, "code": code}})
