"""API keys held in memory: authentication without a database round trip per request.

Keys are loaded from the database at start-up and reloaded in the background every few seconds, so a key
created or revoked with `prefixscope keys ...` takes effect within one refresh interval. While no key has ever
been created the gateway runs open, as the single `default` tenant; once any key exists, every request needs a
valid one. If the first load fails the gateway refuses requests (503) rather than run open by mistake.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from gateway.errors import ServiceUnavailable, Unauthorized

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling."""

    tenant: str
    key_id: str | None
    is_admin: bool


OPEN_PRINCIPAL = Principal(tenant=DEFAULT_TENANT, key_id=None, is_admin=True)


@dataclass(frozen=True)
class KeySnapshot:
    """Active keys (`{key_id: db.keys.KeyEntry}`) and whether any key, active or revoked, exists at all."""

    entries: Any
    any_key_exists: bool


KeyLoader = Callable[[], Awaitable[KeySnapshot]]
KeyVerifier = Callable[[str, Any], Any]


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


class KeyStore:
    """The in-memory key set with a background refresher."""

    def __init__(self, loader: KeyLoader, verify: KeyVerifier, refresh_interval_s: float) -> None:
        self._loader = loader
        self._verify = verify
        self._refresh_interval_s = refresh_interval_s
        self._snapshot: KeySnapshot | None = None
        self._task: asyncio.Task[None] | None = None
        self.on_change: Callable[[KeySnapshot], None] | None = None

    @property
    def loaded(self) -> bool:
        return self._snapshot is not None

    @property
    def open_mode(self) -> bool:
        return self._snapshot is not None and not self._snapshot.any_key_exists

    @property
    def num_active_keys(self) -> int:
        return 0 if self._snapshot is None else len(self._snapshot.entries)

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller behind an Authorization header; raises `Unauthorized` (401) or `ServiceUnavailable`."""
        snapshot = self._snapshot
        if snapshot is None:
            raise ServiceUnavailable("API keys could not be loaded from the database yet; try again shortly.")
        if not snapshot.any_key_exists:
            return OPEN_PRINCIPAL
        token = bearer_token(authorization)
        if token is None:
            raise Unauthorized(
                "You didn't provide an API key. Send it in the Authorization header as 'Bearer YOUR_KEY'."
            )
        entry = self._verify(token, snapshot.entries)
        if entry is None:
            raise Unauthorized("Incorrect API key provided, or the key has been revoked.")
        return Principal(tenant=entry.tenant, key_id=entry.key_id, is_admin=bool(entry.is_admin))

    async def refresh(self) -> bool:
        """Reload keys; on failure keep the last good set. Returns whether the load succeeded."""
        try:
            snapshot = await self._loader()
        except Exception as exc:  # the database may be down; keys already loaded stay valid
            log.warning("could not reload API keys (keeping the previous set): %s", exc)
            return False
        previous, self._snapshot = self._snapshot, snapshot
        if previous is None or previous.any_key_exists != snapshot.any_key_exists:
            if snapshot.any_key_exists:
                log.info("API keys required: %d active key(s) loaded", len(snapshot.entries))
            else:
                log.warning(
                    "No API key exists in the database: the gateway is OPEN and serves every request as tenant "
                    "%r. Create a key with `prefixscope keys create --tenant NAME` to require keys.",
                    DEFAULT_TENANT,
                )
        if self.on_change is not None:
            self.on_change(snapshot)
        return True

    async def start(self) -> None:
        """Load once now, then keep refreshing in the background."""
        await self.refresh()
        self._task = asyncio.create_task(self._refresh_forever(), name="gateway-key-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_interval_s)
            await self.refresh()
