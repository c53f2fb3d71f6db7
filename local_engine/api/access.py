"""Who may call the engine: an API key on every endpoint but `/health`, the admin token on the cache views.

With `api_key` set, every request except `GET /health` needs `Authorization: Bearer <api_key>` (the admin token is
accepted too). The cache views that show or drop every namespace's prefixes (`/v1/cache/tree`, `/v1/cache/flush`)
need the admin token; with an API key but no admin token they are refused. `/v1/cache` gives aggregate statistics
only (capacity, counters, prefill speed), which the gateway records with its history, so the API key suffices. An engine with
neither is open: `prefixscope engine` allows that on a loopback address only (see `check_bind`). Tokens are compared
in constant time. `/v1/cache/match` is a dry run for one namespace, used by the gateway, so the API key suffices.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any

from local_engine.errors import Forbidden, Unauthorized

PUBLIC_PATHS = frozenset({"/health"})
ADMIN_PATHS = frozenset({"/v1/cache/tree", "/v1/cache/flush"})
ENV_API_KEY = "PREFIXSCOPE_ENGINE_API_KEY"


def _bearer(header: str | None) -> str:
    scheme, _, token = (header or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _matches(supplied: str, expected: str | None) -> bool:
    return bool(expected) and hmac.compare_digest(supplied.encode(), expected.encode())  # type: ignore[union-attr]


def check_access(path: str, authorization: str | None, api_key: str | None, admin_token: str | None) -> None:
    """Raise `Unauthorized` (401) or `Forbidden` (403) unless the request may reach `path`."""
    if path in PUBLIC_PATHS:
        return
    path = path.rstrip("/") or "/"
    token = _bearer(authorization)
    if path in ADMIN_PATHS:
        if admin_token:
            if not _matches(token, admin_token):
                raise Unauthorized("the cache views need the engine's admin token (Authorization: Bearer TOKEN)")
        elif api_key:
            raise Forbidden("the cache views are disabled: start the engine with --admin-token")
        return
    if api_key and not (_matches(token, api_key) or _matches(token, admin_token)):
        raise Unauthorized("a valid engine API key is required (Authorization: Bearer KEY)")


def access_guard(api_key: str | None, admin_token: str | None) -> Any:
    """A Litestar guard applying `check_access` to every route."""

    def guard(connection: Any, _handler: Any) -> None:
        check_access(connection.url.path, connection.headers.get("authorization"), api_key, admin_token)

    return guard


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None, insecure: bool) -> str | None:
    """Why the engine must not start on `host` (None: it may). Without a key, only loopback unless `insecure`."""
    if api_key or insecure or is_loopback(host):
        return None
    return (
        f"refusing to listen on {host} without an API key: anyone who can reach it could run inference around the "
        f"gateway and read every tenant's cache. Give --api-key (or ${ENV_API_KEY}), or --insecure to do it anyway."
    )
