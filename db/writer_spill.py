"""The record writer's last-resort paths: the spill file, the `.rejected` file, and the spill_first journal's records
that have no other home yet (see `db.writer` and `db.journal_pending`)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from db.records import RequestRecord

if TYPE_CHECKING:
    from db.journal import Journal
    from db.journal_pending import PendingJournal
    from db.spill import SpillFile
    from db.writer_config import WriterConfig

logger = logging.getLogger("prefixscope.db.writer")


class SpillPaths:
    """Mixed into `RecordWriter`: where records go when the database cannot take them."""

    config: WriterConfig
    _spill: SpillFile
    _journal: Journal | None
    _pending: PendingJournal | None
    _journal_leftovers: bool
    _next_leftover_try: float
    _next_pending_try: float
    _written: int
    _written_in_file: int
    _spilled: int
    _rejected: int
    _lost: int

    async def _store_or_isolate(self, records: list[RequestRecord]) -> Any:
        raise NotImplementedError

    async def _retry_pending(self, now: bool = False) -> None:
        """Give the records kept only in the journal a home: the database, else the spill file (every replay
        interval, and once at stop)."""
        loop = asyncio.get_running_loop()
        if self._pending is None or (not now and loop.time() < self._next_pending_try):
            return
        self._next_pending_try = loop.time() + self.config.replay_interval_s
        records = self._pending.records
        outcome = await self._store_or_isolate(records)
        self._written += outcome.stored
        self._written_in_file += outcome.stored
        rest = records[outcome.processed :]
        if rest:
            try:
                await asyncio.to_thread(self._spill.append, rest)
            except Exception as exc:  # noqa: BLE001 - they stay in the journal; tried again later
                self._pending.settled(rest)
                logger.warning("%d journaled records still cannot be spilled to %s: %s", len(rest), self._spill.path,
                               exc)
                return
            self._spilled += len(rest)
        self._pending.settled([])
        logger.info("%d records kept in the journal have a home again", len(records))

    async def _retry_journal_leftovers(self) -> None:
        """Move a dead process's journal into the spill file, once it can take it (tried every replay interval)."""
        loop = asyncio.get_running_loop()
        if self._journal is None or loop.time() < self._next_leftover_try:
            return
        self._next_leftover_try = loop.time() + self.config.replay_interval_s
        try:
            self._journal_leftovers = not await asyncio.to_thread(self._journal.recover_into, self._spill)
        except Exception:  # noqa: BLE001 - the segments stay on disk for the next try or the next start
            logger.exception("unexpected error moving journal segments into the spill file")

    async def _spill_records(self, records: list[RequestRecord], flags: list[bool] | None = None) -> None:
        try:
            await asyncio.to_thread(self._spill.append, records)
            self._spilled += len(records)
            return
        except Exception:  # noqa: BLE001 - the one place records can be lost; count and log it loudly
            logger.exception("the database cannot take %d records and the spill file %s cannot either",
                             len(records), self._spill.path)
        lost = len(records)
        if self._pending is not None and flags is not None:
            lost = self._pending.keep(records, flags)  # journaled: kept there, retried and replayed at next start
            self._next_pending_try = asyncio.get_running_loop().time() + self.config.replay_interval_s
            if len(records) - lost:
                logger.error("%d records are kept only in the journal beside %s until there is room",
                             len(records) - lost, self._spill.path)
        if lost:
            self._lost += lost
            logger.error("LOST %d records: not in the journal either (%d lost in all)", lost, self._lost)

    async def _reject(self, lines: list[str]) -> None:
        self._rejected += len(lines)
        try:
            await asyncio.to_thread(self._spill.reject, lines)
        except Exception:  # noqa: BLE001
            logger.exception("could not write %d rejected records to %s", len(lines), self._spill.rejected_path)
