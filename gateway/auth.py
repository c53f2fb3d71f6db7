"""API keys held in memory: authentication without a database round trip per request.

Keys are loaded from the database at start-up and reloaded in the background every few seconds, so a key
revoked with `prefixscope keys revoke` is refused within one refresh interval. A key the table in memory does not
know (one created a moment ago) makes `authenticate_now` re-read the table before it answers 401, so a new key works
on its very next request. Those re-reads are bounded: at most one per `min_reread_interval_s`, shared by every
request waiting on it, so a flood of bad keys costs the database a few reads a second, never one read per request. The gateway runs open (every
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
from dataclasses import dataclass, field, replace
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
    """Active keys (`{key_id: db.keys.KeyEntry}`), whether any key, active or revoked, exists at all, when the key
    table was read (seconds since the epoch; 0 when unknown) and the revoked keys."""

    entries: Any
    any_key_exists: bool
    loaded_at: float = 0.0
    revoked: Any = field(default_factory=dict)
    """Revoked keys (`{key_id: db.keys.KeyEntry}`), so that a revoked key is refused as revoked, not as unknown."""


KeyLoader = Callable[[], Awaitable[KeySnapshot]]
KeyVerifier = Callable[[str, Any], Any]
SnapshotSaver = Callable[[KeySnapshot], Awaitable[None]]
SnapshotReader = Callable[[], Awaitable[KeySnapshot | None]]

DEFAULT_MAX_KEY_STALENESS_S = 60.0
DEFAULT_MIN_REREAD_INTERVAL_S = 0.25
"""The shortest time (seconds) between two re-reads of the key table caused by unknown keys: at most 4 a second."""

NO_KEY_GIVEN = "You didn't provide an API key. Send it in the Authorization header as 'Bearer YOUR_KEY'."
UNKNOWN_KEY = (
    "Incorrect API key provided: no key in the gateway's key table matches it (the table was re-read just now). "
    "Create one with `prefixscope keys create --tenant NAME`."
)
REVOKED_KEY = "This API key has been revoked. Create a new one with `prefixscope keys create --tenant NAME`."
NO_KEY_EXISTS = (
    "No API key exists in the gateway's key table and the gateway is not running open. Create a key with "
    "`prefixscope keys create --tenant NAME`, or start the gateway with --open (auth = \"none\") to serve without "
    "keys."
)


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


def credentials(authorization: str | None, api_key: str | None) -> str | None:
    """The `Authorization` value a key store authenticates: an `x-api-key` value (Anthropic's header) as a bearer
    token when one is given, else the `Authorization` header as sent (None: neither)."""
    key = (api_key or "").strip()
    return f"Bearer {key}" if key else authorization


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
        min_reread_interval_s: float = DEFAULT_MIN_REREAD_INTERVAL_S,
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
        self._min_reread_interval_s = min_reread_interval_s
        self._reread: asyncio.Task[bool] | None = None
        self._reread_started = float("-inf")  # time.monotonic() when the latest re-read began
        self.rereads = 0
        """Re-reads of the key table caused by keys the table in memory did not know."""
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
            return NO_KEY_EXISTS
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
            raise Unauthorized(NO_KEY_GIVEN)
        entry = self._verify(token, snapshot.entries)
        if entry is None:
            if snapshot.revoked and self._verify(token, snapshot.revoked) is not None:
                raise Unauthorized(REVOKED_KEY)
            raise Unauthorized(UNKNOWN_KEY)
        return Principal(tenant=entry.tenant, key_id=entry.key_id, is_admin=bool(entry.is_admin))

    async def authenticate_now(self, authorization: str | None) -> Principal:
        """`authenticate`, but a key the table in memory does not know (or a key sent while the table held none)
        first makes the key table be re-read, so a key created a moment ago works on its first request.

        The re-read is one that began after this call did (shared with every other caller waiting), and re-reads
        begin at most once per `min_reread_interval_s`: a caller may wait that long plus one read before its 401.
        Raises `Unauthorized` (401: no key sent, unknown key, revoked key) or `ServiceUnavailable` (503).
        """
        try:
            return self.authenticate(authorization)
        except (Unauthorized, ServiceUnavailable) as refusal:
            if self._open or bearer_token(authorization) is None or not self._reread_may_help(refusal):
                raise
        await self._reread_after(time.monotonic())
        return self.authenticate(authorization)

    def _reread_may_help(self, refusal: Exception) -> bool:
        snapshot = self._snapshot
        if snapshot is None:
            return True
        if isinstance(refusal, ServiceUnavailable):
            return refusal.message == NO_KEY_EXISTS
        return refusal.message == UNKNOWN_KEY

    async def _reread_after(self, arrived: float) -> None:
        """Wait for a re-read of the key table that began at or after `arrived` (time.monotonic()), starting one
        when none is running and the last began at least `min_reread_interval_s` ago."""
        while True:
            task = self._reread
            if task is not None and self._reread_started >= arrived:
                await asyncio.shield(task)
                return
            if task is not None and not task.done():
                await asyncio.shield(task)  # began before this caller arrived: it may predate the key
                continue
            wait_s = self._reread_started + self._min_reread_interval_s - time.monotonic()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
                continue
            self._reread_started = time.monotonic()
            self.rereads += 1
            self._reread = asyncio.create_task(self._reread_now(), name="gateway-key-reread")
            await asyncio.shield(self._reread)
            return

    async def _reread_now(self) -> bool:
        # The read begins now, not when it was asked for: every caller that arrived before this serves from it.
        self._reread_started = time.monotonic()
        return await self.refresh()

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
                    "`prefixscope keys create --tenant NAME` (it works on its first request), or run open on "
                    "purpose with --open."
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
        if self._reread is not None and not self._reread.done():
            self._reread.cancel()
            with suppress(asyncio.CancelledError):
                await self._reread
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_interval_s)
            await self.refresh()
