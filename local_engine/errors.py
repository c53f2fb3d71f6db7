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


class ModelNotFound(EngineError):
    """The request names a model this engine does not serve: OpenAI's answer to an unknown model (HTTP 404,
    `invalid_request_error`, code `model_not_found`, param null)."""

    status_code = 404
    error_type = "invalid_request_error"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"The model `{model}` does not exist or you do not have access to it.", code="model_not_found"
        )


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

    @classmethod
    def pool_too_small(cls, num_tokens: int, num_slots: int) -> CapacityExceeded:
        """A request of `num_tokens` tokens that a pool of `num_slots` slots can never hold."""
        return cls(f"the request needs {num_tokens} KV slots but the pool holds {num_slots} and it cannot fit even "
                   f"with every unused prefix evicted", code="kv_cache_full")


class EngineStopped(EngineError):
    status_code = 503
    error_type = "server_unavailable"
