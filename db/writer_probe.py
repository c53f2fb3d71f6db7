"""How the record writer tells "the database cannot take writes now" (keep the records) from "the database refuses
this data" (set them aside): see `db.writer`."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sqlalchemy import exc as sa_exc
from sqlalchemy import select

from db.store import REQUESTS

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from db.writer_config import WriterConfig

# Errors that say the database cannot take writes now, whatever the data: no connection, a missing file or schema,
# a lock held past the busy timeout, a deadlock or cancelled statement, a write that timed out.
_UNAVAILABLE_ERRORS = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
    OSError,
    TimeoutError,
)


class DatabaseProbe:
    """Mixed into `RecordWriter`: probes the database after a failed write."""

    config: WriterConfig
    _engine: AsyncEngine | None

    async def _probe(self) -> bool:
        """Whether the database takes queries on the `requests` table right now."""
        engine = self._engine
        if engine is None:
            return False

        async def query() -> None:
            async with engine.connect() as conn:
                await conn.execute(select(REQUESTS.c.id).limit(0))

        try:
            await asyncio.wait_for(query(), timeout=self.config.write_timeout_s)
        except Exception:  # noqa: BLE001 - any failure means "not now"
            return False
        return True

    async def _is_unavailable(self, exc: BaseException) -> bool:
        """Whether a failed write means "not now" (keep the records) rather than "not this data" (set them aside).

        Some errors say so outright. Beyond those, drivers report a missing server, database or table with many
        exception types, so the database is probed: if the probe fails too, it is unavailable.
        """
        return isinstance(exc, _UNAVAILABLE_ERRORS) or not await self._probe()
