"""`RecordWriter`: the recorder's database side. The request path hands records over and never waits.

`submit` puts a record on a bounded in-memory queue (a full queue drops the record and counts it). A background
task takes batches off the queue and stores them: request rows and rollups in one transaction. When the database
cannot be reached the batch goes to the spill file instead; until a probe succeeds (every `replay_interval_s`) new
batches go straight to the spill file rather than waiting on timeouts. Once the database is back, the spill file is
replayed chunk by chunk and truncated. Storing is idempotent by request id, so a replay never duplicates a row or
double counts a rollup. A record the database refuses (bad data) is set aside in the `.rejected` file next to the
spill file. Every record ends up counted in exactly one of written, spilled (then replayed), rejected, dropped,
journaled_pending (spill_first: the spill file failed, the record waits in the journal) or lost (the spill file
failed and the record is in no journal), and `counters()` exposes those counts.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import exc as sa_exc
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import create_async_engine_for
from db.file_watch import DatabaseFileWatch
from db.journal import Journal
from db.journal_pending import PendingJournal
from db.records import RequestRecord
from db.spill import SpillFile
from db.store import REQUESTS, StoreResult, store_records
from db.writer_config import WriterConfig, WriterCounters
from db.writer_spill import SpillPaths

__all__ = ["RecordWriter", "WriterConfig", "WriterCounters"]

logger = logging.getLogger("prefixscope.db.writer")

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


@dataclass(frozen=True)
class _Outcome:
    processed: int  # leading records that were stored or rejected; the rest still need a home
    stored: int


class RecordWriter(SpillPaths):
    """Batches request records into the database from a background task; see the module docstring.

    `submit` must be called from the event loop the writer was started on (it is not thread-safe).
    """

    def __init__(
        self, database_url: str, config: WriterConfig = WriterConfig(), engine: AsyncEngine | None = None
    ) -> None:
        self.database_url = database_url
        self.config = config
        self._queue: asyncio.Queue[RequestRecord] = asyncio.Queue(maxsize=config.queue_size)
        self._engine = engine
        self._owns_engine = engine is None
        self._spill = SpillFile(config.spill_path)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._closed = False
        self._available = True
        self._next_probe = 0.0
        self._in_flight = 0
        self._accepted = self._written = self._spilled = self._replayed = 0
        self._dropped = self._rejected = self._lost = self._batches = 0
        self._watch = DatabaseFileWatch.for_url(database_url)
        self._recreated = self._generation = self._written_in_file = self._replayed_in_file = 0
        self._journal = Journal(config.spill_path) if config.durability == "spill_first" else None
        self._journaled: deque[bool] = deque()
        self._pending = None if self._journal is None else PendingJournal(self._journal)
        self._next_pending_try = 0.0
        self._journal_leftovers = False  # a dead process's journal segments not yet moved into the spill file
        self._next_leftover_try = 0.0
        self._sync_task: asyncio.Task[None] | None = None

    # -- the request path -------------------------------------------------------------------------------------

    def submit(self, record: RequestRecord) -> bool:
        """Queue a record for writing without waiting; False (and a counted drop) if the queue is full or closed."""
        if self._closed:
            self._dropped += 1
            return False
        if self._journal is not None:
            if self._queue.full():
                self._dropped += 1
                return False
            self._journaled.append(self._journal.append(record.to_json()))
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self._dropped += 1
            return False
        self._accepted += 1
        return True

    def counters(self) -> WriterCounters:
        """A snapshot of the counts."""
        return WriterCounters(
            queued=self._queue.qsize() + self._in_flight,
            written=self._written,
            spilled=self._spilled,
            replayed=self._replayed,
            dropped=self._dropped,
            pending_spill=self._spill.pending,
            accepted=self._accepted,
            rejected=self._rejected,
            lost=self._lost,
            batches=self._batches,
            database_available=self._available,
            database_recreated=self._recreated,
            journal_failures=0 if self._journal is None else self._journal.failed_appends,
            torn_tails_cut=self._spill.torn_tails_cut,
            journaled_pending=0 if self._pending is None else len(self._pending.records),
        )

    # -- lifecycle --------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the background task is running."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Start the background task (records from an earlier run's spill file are replayed once it runs)."""
        if self._task is not None:
            return
        if self._engine is None:
            self._engine = create_async_engine_for(self.database_url)
        if self._journal is not None:
            self._journal_leftovers = not await asyncio.to_thread(self._journal.recover_into, self._spill)
            self._sync_task = asyncio.create_task(
                self._journal.sync_forever(self.config.journal_fsync_interval_s), name="prefixscope-journal-sync"
            )
        self._task = asyncio.create_task(self._run(), name="prefixscope-record-writer")

    async def flush(self) -> None:
        """Wait until every record submitted so far is written or spilled."""
        if not self.running:
            raise RuntimeError("the writer is not running")
        await self._queue.join()

    async def stop(self) -> None:
        """Refuse new records, write or spill everything queued, try a last replay, and release the engine."""
        self._closed = True
        if self._task is None and not self._queue.empty():
            await self.start()
        if self._task is not None:
            self._stopping = True
            await self._task
        if self._sync_task is not None:
            self._sync_task.cancel()
            await asyncio.gather(self._sync_task, return_exceptions=True)
        if self._journal is not None:
            # Every journaled record is stored, spilled or rejected now, unless some are pending (kept for next start).
            pending = 0 if self._pending is None else len(self._pending.records)
            if pending:
                logger.error("%d records stay in the journal beside %s, replayed at the next start", pending,
                             self._spill.path)
            self._journal.close(remove=not pending)
        if self._owns_engine and self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    # -- background task --------------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            if batch:
                flags = None if self._pending is None else self._pending.take_flags(self._journaled, len(batch))
                try:
                    await self._handle(batch, flags)
                except Exception:  # noqa: BLE001 - a bug must not stop recording; count what it cost
                    logger.exception("unexpected error handling a batch of %d records", len(batch))
                    self._lost += len(batch)
                finally:
                    self._in_flight = 0
                    if self._pending is not None and flags is not None:
                        self._pending.resolve(sum(flags))
                    for _ in batch:
                        self._queue.task_done()
            if self._stopping and self._queue.empty():
                break
            if self._journal_leftovers:
                await self._retry_journal_leftovers()
            if self._pending is not None and self._pending.records:
                await self._retry_pending()
            try:
                await self._maybe_replay()
            except Exception:  # noqa: BLE001
                logger.exception("unexpected error replaying the spill file")
                self._next_probe = asyncio.get_running_loop().time() + self.config.replay_interval_s
        if self._pending is not None and self._pending.records:
            await self._retry_pending(now=True)
        await self._replay_all()

    async def _collect(self) -> list[RequestRecord]:
        """Wait for a first record, then take more until the batch is full or `flush_interval_s` has passed."""
        loop = asyncio.get_running_loop()
        # Don't idle while there is a backlog to replay into a reachable database.
        replaying = self._available and self._spill.pending > 0
        idle_wait = 0.0 if (replaying or self._stopping) else self.config.flush_interval_s
        first: RequestRecord | None
        try:
            first = self._queue.get_nowait()
        except asyncio.QueueEmpty:
            try:
                first = await asyncio.wait_for(self._queue.get(), timeout=idle_wait) if idle_wait else None
            except TimeoutError:
                first = None
        if first is None:
            return []
        batch = [first]
        self._in_flight = 1
        deadline = loop.time() + self.config.flush_interval_s
        while len(batch) < self.config.batch_size:
            try:
                batch.append(self._queue.get_nowait())
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0 or self._stopping:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), timeout=remaining))
                except TimeoutError:
                    break
            self._in_flight = len(batch)
        return batch

    async def _store(self, records: Sequence[RequestRecord]) -> StoreResult:
        if self._engine is None:
            raise RuntimeError("the writer has no engine; call start() first")

        async def transaction() -> StoreResult:
            assert self._engine is not None
            async with self._engine.begin() as conn:
                return await conn.run_sync(store_records, records)

        if self._watch is not None and self._watch.replaced():
            await self._recreate_database()
        result = await asyncio.wait_for(transaction(), timeout=self.config.write_timeout_s)
        if self._watch is not None and self._watch.replaced():
            # Committed into a file that is no longer the one at the path: store the batch again where it belongs.
            await self._recreate_database()
            result = await asyncio.wait_for(transaction(), timeout=self.config.write_timeout_s)
        self._batches += 1
        return result

    async def _recreate_database(self) -> None:
        """The SQLite file was deleted or replaced: reopen and migrate the database at the path. Rows stored into the
        old file are not in the database any more: they move from written/replayed to lost."""
        from db.migrate import upgrade_async

        assert self._watch is not None and self._engine is not None
        if self._watch.first_report():  # once per event, not once per failed retry
            gone = self._written_in_file + self._replayed_in_file
            self._written -= self._written_in_file
            self._replayed -= self._replayed_in_file
            self._lost += gone
            self._written_in_file = self._replayed_in_file = 0
            self._recreated += 1
            logger.error(
                "the database file %s was deleted or replaced under the gateway: %d records stored in the old file "
                "are lost with it; recreating and migrating the database at the path",
                self._watch.path,
                gone,
            )
        await self._engine.dispose()
        await asyncio.to_thread(self._watch.remove_stale_companions)
        await upgrade_async(self.database_url)
        self._watch.reset()
        self._generation += 1

    @property
    def database_generation(self) -> int:
        """How many times the database file was recreated (readers reopen their connections when it changes)."""
        return self._generation

    def _mark_unavailable(self, exc: BaseException) -> None:
        if self._available:
            logger.warning("database unavailable, spilling records to %s: %s", self._spill.path, exc)
        self._available = False
        self._next_probe = asyncio.get_running_loop().time() + self.config.replay_interval_s

    def _mark_available(self) -> None:
        if not self._available:
            logger.info("database available again")
        self._available = True

    async def _handle(self, batch: list[RequestRecord], flags: list[bool] | None = None) -> None:
        if self._available:
            outcome = await self._store_or_isolate(batch)
            self._written += outcome.stored
            self._written_in_file += outcome.stored
            batch = batch[outcome.processed :]
            flags = None if flags is None else flags[outcome.processed :]
        if batch:
            await self._spill_records(batch, flags)

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

    async def _store_or_isolate(self, records: list[RequestRecord]) -> _Outcome:
        """Store records, stopping at the first sign that the database is unavailable.

        When the database is there but the batch failed, the data is at fault: the records are retried one by one
        and those the database refuses are rejected (counted, and kept in the `.rejected` file), so that one bad
        record can neither block the spill file nor take its batch down with it.
        """
        try:
            await self._store(records)
            self._mark_available()
            return _Outcome(processed=len(records), stored=len(records))
        except Exception as exc:  # noqa: BLE001 - nothing may escape the writer task
            if await self._is_unavailable(exc):
                self._mark_unavailable(exc)
                return _Outcome(processed=0, stored=0)
            logger.warning("a batch of %d records failed, retrying one by one: %r", len(records), exc)
        stored = 0
        for index, record in enumerate(records):
            try:
                await self._store([record])
                stored += 1
            except Exception as exc:  # noqa: BLE001
                if await self._is_unavailable(exc):
                    self._mark_unavailable(exc)
                    return _Outcome(processed=index, stored=stored)
                logger.error("database refused record %s: %r", record.request_id, exc)
                await self._reject([record.to_json()])
        return _Outcome(processed=len(records), stored=stored)

    async def _maybe_replay(self) -> None:
        if self._spill.pending == 0:
            if not self._available and asyncio.get_running_loop().time() >= self._next_probe:
                self._available = True  # nothing to replay with: let the next batch be the probe
            return
        if self._available or asyncio.get_running_loop().time() >= self._next_probe:
            await self._replay_chunk()

    async def _replay_chunk(self) -> bool:
        """Replay one chunk of the spill file; False if the database is still unavailable."""
        try:
            chunk = await asyncio.to_thread(self._spill.read_chunk, self.config.replay_batch_size)
        except Exception:  # noqa: BLE001
            logger.exception("could not read the spill file %s", self._spill.path)
            self._next_probe = asyncio.get_running_loop().time() + self.config.replay_interval_s
            return False
        if chunk.records:
            outcome = await self._store_or_isolate(chunk.records)
            if outcome.processed < len(chunk.records):
                # Nothing is consumed: the chunk is read again, and what was stored is skipped as a duplicate then.
                return False
            self._replayed += outcome.stored
            self._replayed_in_file += outcome.stored
        if chunk.bad_lines:
            await self._reject(chunk.bad_lines)
        self._spill.advance(chunk)
        return True

    async def _replay_all(self) -> None:
        """At stop: replay whatever the database takes now, ignoring the probe interval."""
        while self._spill.pending > 0:
            if not await self._replay_chunk():
                logger.warning("%d records stay in the spill file %s", self._spill.pending, self._spill.path)
                return
