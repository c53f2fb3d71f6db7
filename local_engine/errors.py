"""The engine's exceptions. The HTTP edge maps each to an OpenAI-shaped error body with its status code."""

from __future__ import annotations


class EngineError(Exception):
    status_code = 500
    error_type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}


class InvalidRequest(EngineError):
    """The request is malformed or asks for something this engine does not do."""

    status_code = 400
    error_type = "invalid_request_error"


class Unauthorized(EngineError):
    status_code = 401
    error_type = "authentication_error"


class Forbidden(EngineError):
    status_code = 403
    error_type = "permission_error"


class CapacityExceeded(EngineError):
    """The request cannot fit in the KV pool even with everything evictable evicted, or the queue is full."""

    status_code = 503
    error_type = "server_overloaded"


class EngineStopped(EngineError):
    status_code = 503
    error_type = "server_unavailable"
