"""API keys held in memory: authentication without a database round trip per request.

Keys are loaded from the database at start-up and reloaded in the background every few seconds, so a key
created or revoked with `prefixscope keys ...` takes effect within one refresh interval. The gateway runs open (every
request served as the single `default` tenant) only when the operator says so (`--open`, `auth = "none"`); it is
never inferred. Otherwise every request needs a valid key, and the gateway refuses requests with 503 while it
cannot know the keys: before the first load, while no key exists at all, and once the last good snapshot is older
than `max_key_staleness_s` (the database has been unreadable that long). Within that bound the snapshot answers, so
a key revoked before an outage stays revoked during it. Each good snapshot is also kept on local disk (hashes only)
so that a gateway restarted while the database is down starts from it, under the same staleness bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, replace
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
    """Active keys (`{key_id: db.keys.KeyEntry}`), whether any key, active or revoked, exists at all, and when the
    key table was read (seconds since the epoch; 0 when unknown)."""

    entries: Any
    any_key_exists: bool
    loaded_at: float = 0.0


KeyLoader = Callable[[], Awaitable[KeySnapshot]]
KeyVerifier = Callable[[str, Any], Any]
SnapshotSaver = Callable[[KeySnapshot], Awaitable[None]]
SnapshotReader = Callable[[], Awaitable[KeySnapshot | None]]

DEFAULT_MAX_KEY_STALENESS_S = 60.0


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

    def __init__(
        self,
        loader: KeyLoader,
        verify: KeyVerifier,
        refresh_interval_s: float,
        *,
        open_mode: bool = False,
        max_staleness_s: float = DEFAULT_MAX_KEY_STALENESS_S,
        save_snapshot: SnapshotSaver | None = None,
        read_saved_snapshot: SnapshotReader | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`open_mode` serves everyone as the `default` tenant (the operator's explicit choice); `max_staleness_s`
        bounds how old (seconds) the last good key snapshot may be before requests are refused; `save_snapshot` and
        `read_saved_snapshot` keep a snapshot on local disk for a start while the database is down."""
        self._loader = loader
        self._verify = verify
        self._refresh_interval_s = refresh_interval_s
        self._open = open_mode
        self._max_staleness_s = max_staleness_s
        self._save_snapshot = save_snapshot
        self._read_saved_snapshot = read_saved_snapshot
        self._clock = clock
        self._snapshot: KeySnapshot | None = None
        self._task: asyncio.Task[None] | None = None
        self.on_change: Callable[[KeySnapshot], None] | None = None

    @property
    def loaded(self) -> bool:
        return self._open or self._snapshot is not None

    @property
    def open_mode(self) -> bool:
        return self._open

    @property
    def snapshot_age_s(self) -> float | None:
        """Seconds since the key table was last read (None before any snapshot)."""
        return None if self._snapshot is None else max(0.0, self._clock() - self._snapshot.loaded_at)

    @property
    def num_active_keys(self) -> int:
        return 0 if self._snapshot is None else len(self._snapshot.entries)

    def refusal_reason(self) -> str | None:
        """Why every request is refused with 503 right now (None while keys are checked or the gateway is open)."""
        if self._open:
            return None
        snapshot = self._snapshot
        if snapshot is None:
            return (
                "API keys could not be loaded from the database yet and no local key snapshot exists; "
                "requests are refused until the key table is readable."
            )
        age_s = self._clock() - snapshot.loaded_at
        if age_s > self._max_staleness_s:
            return (
                f"The API key table has not been readable for {age_s:.0f} s, longer than "
                f"auth.max_key_staleness_s = {self._max_staleness_s:g} s; requests are refused until it is readable "
                "again."
            )
        if not snapshot.any_key_exists:
            return (
                "No API key exists and the gateway is not running open. Create a key with "
                "`prefixscope keys create --tenant NAME`, or start the gateway with --open (auth = \"none\") to "
                "serve without keys."
            )
        return None

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller behind an Authorization header; raises `Unauthorized` (401) or `ServiceUnavailable`."""
        if self._open:
            return OPEN_PRINCIPAL
        reason = self.refusal_reason()
        if reason is not None:
            raise ServiceUnavailable(reason)
        snapshot = self._snapshot
        assert snapshot is not None
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
            snapshot = replace(await self._loader(), loaded_at=self._clock())
        except Exception as exc:  # the database may be down; keys already loaded stay valid for a while
            log.warning("could not reload API keys (keeping the previous set within its staleness bound): %s", exc)
            return False
        previous, self._snapshot = self._snapshot, snapshot
        if previous is None or previous.any_key_exists != snapshot.any_key_exists:
            if snapshot.any_key_exists:
                log.info("API keys required: %d active key(s) loaded", len(snapshot.entries))
            elif not self._open:
                log.error(
                    "No API key exists in the database: every request is refused (503). Create a key with "
                    "`prefixscope keys create --tenant NAME`, or run open on purpose with --open."
                )
        if self._save_snapshot is not None:
            try:
                await self._save_snapshot(snapshot)
            except Exception:  # noqa: BLE001 - the snapshot on disk is a fallback; the keys in memory are good
                log.exception("could not save the local key snapshot")
        if self.on_change is not None:
            self.on_change(snapshot)
        return True

    async def _load_saved(self) -> None:
        if self._read_saved_snapshot is None:
            return
        try:
            saved = await self._read_saved_snapshot()
        except Exception:  # noqa: BLE001
            log.exception("could not read the local key snapshot")
            return
        if saved is None or self._snapshot is not None:
            return
        self._snapshot = saved
        log.warning(
            "the key table is unreadable: authenticating from the local key snapshot read %.0f s ago (good for "
            "%g s in all)",
            self._clock() - saved.loaded_at,
            self._max_staleness_s,
        )
        if self.on_change is not None:
            self.on_change(saved)

    async def start(self) -> None:
        """Load once now (from the local snapshot if the database cannot be read), then keep refreshing."""
        if self._open:
            log.warning(
                "The gateway is OPEN (auth = \"none\"): no API key is checked and every request is served as "
                "tenant %r with admin rights.",
                DEFAULT_TENANT,
            )
        if not await self.refresh():
            await self._load_saved()
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
