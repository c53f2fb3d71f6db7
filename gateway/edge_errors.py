"""Exception handlers of the Litestar endpoints: every error leaves as an OpenAI-shaped body.

The completions endpoints answer their own errors (raw ASGI, see `proxy`); these handlers cover the others
(`/v1/models`, `/api/stats`, unknown paths) and count each error in the metrics, since those requests have no
request record.
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException

from gateway.errors import GatewayError, error_body
from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)


def _json(body: bytes, status_code: int) -> Response[bytes]:
    return Response(content=body, status_code=status_code, media_type="application/json")


def exception_handlers(metrics: GatewayMetrics) -> dict[Any, Any]:
    def gateway_error(_: Request[Any, Any, Any], exc: GatewayError) -> Response[bytes]:
        metrics.count_error(exc.error_type)
        return _json(exc.body(), exc.status_code)

    def http_exception(_: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
        if exc.status_code == 404:
            error_type = "not_found_error"
        elif exc.status_code >= 500:
            error_type = "server_error"
        else:
            error_type = "invalid_request_error"
        metrics.count_error(error_type)
        return _json(error_body(str(exc.detail), error_type), exc.status_code)

    def unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
        log.exception("unexpected error on %s", request.url.path, exc_info=exc)
        metrics.count_error("server_error")
        return _json(error_body("The gateway hit an internal error.", "server_error"), 500)

    return {GatewayError: gateway_error, HTTPException: http_exception, Exception: unexpected}
