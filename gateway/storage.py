"""The gateway's one door to the database (`db` package): schema, record writer, keys and stats queries.

The request path only touches `sink.submit` (a non-blocking queue put). Everything else here runs at start-up,
in the background key refresh, or behind `/api/stats`. A database that cannot be reached at start-up does not stop
the gateway: records go to the spill file, keys come from the local key snapshot, and the schema migration is retried
in the background until it succeeds (the writer then replays what was spilled).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from db.writer_config import WriterConfig
from gateway.auth import KeySnapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StorageConfig:
    database_url: str
    recorder: WriterConfig
    run_migrations: bool = True
    key_snapshot_path: Path | None = None  # where the last good key table is kept (hashes only)


class DatabaseStorage:
    """Owns the async engine and the record writer for one database URL."""

    def __init__(self, config: StorageConfig) -> None:
        from db.engine import create_async_engine_for
        from db.writer import RecordWriter

        self.config = config
        self._engine = create_async_engine_for(config.database_url)
        self.sink = RecordWriter(config.database_url, config.recorder)
        self._migration_task: asyncio.Task[None] | None = None
        self._generation = 0
        self.migrated = not config.run_migrations

    async def _migrate(self) -> None:
        from db.migrate import upgrade_async

        await upgrade_async(self.config.database_url)
        self.migrated = True

    async def start(self) -> None:
        """Migrate the schema and start the writer; if the database is unreachable, start anyway (see above)."""
        if self.config.run_migrations:
            try:
                await self._migrate()
            except Exception as exc:  # noqa: BLE001 - any failure here means "not now": keep serving
                log.error(
                    "the database is unreachable at start-up (%s): serving with records spilled to %s and keys from "
                    "the local snapshot; retrying the connection and the migration every %g s",
                    exc,
                    self.config.recorder.spill_path,
                    self.config.recorder.replay_interval_s,
                )
                self._migration_task = asyncio.create_task(self._migrate_until_done(), name="gateway-db-migrate")
        await self.sink.start()

    async def _migrate_until_done(self) -> None:
        while True:
            await asyncio.sleep(self.config.recorder.replay_interval_s)
            try:
                await self._migrate()
            except Exception as exc:  # noqa: BLE001
                log.warning("the database is still unreachable: %s", exc)
                continue
            log.info("the database is reachable and migrated; spilled records are being replayed")
            return

    async def stop(self) -> None:
        if self._migration_task is not None:
            self._migration_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._migration_task
        try:
            await self.sink.stop()
        finally:
            await self._engine.dispose()

    async def _fresh_engine(self) -> None:
        """Drop connections to a SQLite file the writer found deleted or replaced, so reads see the new one."""
        generation = self.sink.database_generation
        if generation != self._generation:
            self._generation = generation
            await self._engine.dispose()

    async def save_key_snapshot(self, snapshot: KeySnapshot) -> None:
        """Keep the last good key table on local disk (hashes only)."""
        path = self.config.key_snapshot_path
        if path is not None:
            from gateway.key_snapshot import write_key_snapshot

            await asyncio.to_thread(write_key_snapshot, Path(path), snapshot)

    async def read_saved_key_snapshot(self) -> KeySnapshot | None:
        """The key table saved by `save_key_snapshot`, or None."""
        path = self.config.key_snapshot_path
        if path is None:
            return None
        from gateway.key_snapshot import read_key_snapshot

        return await asyncio.to_thread(read_key_snapshot, Path(path))

    async def load_keys(self) -> KeySnapshot:
        from db.keys import index_keys, load_active_keys_async, load_revoked_keys_async

        if not self.migrated:
            raise ConnectionError("the database has not been reached and migrated yet")
        await self._fresh_engine()
        entries = await load_active_keys_async(self._engine)
        revoked = await load_revoked_keys_async(self._engine)
        # An empty key table is refused with 503; a revoked key gets 401 saying so.
        return KeySnapshot(
            entries=index_keys(entries), any_key_exists=bool(entries or revoked), revoked=index_keys(revoked)
        )

    @staticmethod
    def verify_key(plaintext: str, entries: Any) -> Any:
        from db.keys import verify_key

        return verify_key(plaintext, entries)

    async def stats(
        self, since: datetime, until: datetime, bucket: str, group_by: str | None, tenant: str | None
    ) -> list[Any]:
        from db.engine import run_query

        try:
            from db.queries import stats
        except ImportError:
            from db.queries.history import stats

        return await run_query(
            self._engine, stats, since=since, until=until, bucket=bucket, group_by=group_by, tenant=tenant
        )

    async def conversations(
        self, since: datetime, until: datetime, tenant: str | None, limit: int
    ) -> list[Any]:
        """`db.queries.conversations.conversations` over this database."""
        from db.engine import run_query
        from db.queries.conversations import conversations

        return await run_query(self._engine, conversations, since=since, until=until, tenant=tenant, limit=limit)

    async def conversation(self, conversation_id: str, tenant: str | None) -> Any | None:
        """`db.queries.conversations.conversation` over this database (None: no such conversation for `tenant`)."""
        from db.engine import run_query
        from db.queries.conversations import conversation

        return await run_query(self._engine, conversation, conversation_id=conversation_id, tenant=tenant)

    async def record_engine_context(self, upstream: str, stats: dict[str, Any]) -> None:
        """Record an engine's `/v1/cache` answer as the database's context for `upstream` (`db.engine_context`)."""
        from datetime import UTC

        from db.engine import run_write
        from db.engine_context import context_from_stats, record_engine_context

        context = context_from_stats(upstream, stats, datetime.now(UTC))
        await run_write(self._engine, record_engine_context, context)
