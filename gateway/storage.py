"""The gateway's one door to the database (`db` package): schema, record writer, keys and stats queries.

The request path only touches `sink.submit` (a non-blocking queue put). Everything else here runs at start-up,
in the background key refresh, or behind `/api/stats`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway.auth import KeySnapshot
from gateway.config import RecorderConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StorageConfig:
    database_url: str
    recorder: RecorderConfig
    run_migrations: bool = True


class DatabaseStorage:
    """Owns the async engine and the record writer for one database URL."""

    def __init__(self, config: StorageConfig) -> None:
        from db.engine import create_async_engine_for
        from db.writer import RecordWriter, WriterConfig

        self.config = config
        self._engine = create_async_engine_for(config.database_url)
        self.sink = RecordWriter(
            WriterConfig(
                database_url=config.database_url,
                queue_size=config.recorder.queue_size,
                batch_size=config.recorder.batch_size,
                flush_interval_s=config.recorder.flush_interval_s,
                spill_path=Path(config.recorder.spill_path),
                replay_interval_s=config.recorder.replay_interval_s,
            )
        )

    async def start(self) -> None:
        if self.config.run_migrations:
            from db.migrate import upgrade_async

            await upgrade_async(self.config.database_url)
        await self.sink.start()

    async def stop(self) -> None:
        try:
            await self.sink.stop()
        finally:
            await self._engine.dispose()

    async def load_keys(self) -> KeySnapshot:
        from sqlalchemy import func, select

        from db.keys import index_keys, load_active_keys_async
        from db.models import ApiKey

        entries = await load_active_keys_async(self._engine)
        if entries:
            return KeySnapshot(entries=index_keys(entries), any_key_exists=True)
        # No active key: the gateway runs open only if no key was ever created (revoking the last key must not
        # open the gateway up).
        async with self._engine.connect() as conn:
            total = (await conn.execute(select(func.count()).select_from(ApiKey.__table__))).scalar_one()
        return KeySnapshot(entries={}, any_key_exists=total > 0)

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

    async def record_engine_context(self, upstream: str, stats: dict[str, Any]) -> None:
        """Record an engine's `/v1/cache` answer as the database's context for `upstream` (`db.engine_context`)."""
        from datetime import UTC

        from db.engine import run_write
        from db.engine_context import context_from_stats, record_engine_context

        context = context_from_stats(upstream, stats, datetime.now(UTC))
        await run_write(self._engine, record_engine_context, context)
