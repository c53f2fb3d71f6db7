"""Record durability under faults: the SQLite file deleted or replaced, a full disk (database and spill file), a torn
spill tail, and the spill_first journal surviving a process that dies without stopping the writer."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import event

from db.engine import create_async_engine_for
from db.journal import Journal
from db.records import RequestRecord
from db.spill import SpillFile
from db.writer import RecordWriter, WriterConfig

MakeRecord = Callable[..., RequestRecord]


def _config(tmp_path: Path, **overrides: object) -> WriterConfig:
    values: dict[str, object] = {
        # These tests were written against the writer's own former defaults; they keep them.
        "queue_size": 10_000,
        "batch_size": 500,
        "durability": "queue_first",
        "spill_path": tmp_path / "spill" / "requests.jsonl",
        "flush_interval_s": 0.01,
        "replay_interval_s": 60.0,
    }
    values.update(overrides)
    return WriterConfig(**values)  # type: ignore[arg-type]


def _sqlite(sqlite_template: Path, path: Path) -> str:
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


async def _submit_and_flush(writer: RecordWriter, records: list[RequestRecord]) -> None:
    for item in records:
        assert writer.submit(item)
    await writer.flush()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_sqlite_file_deleted_or_replaced_under_the_writer(
    how: str, sqlite_template: Path, tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    path = tmp_path / "prefixscope.db"
    url = _sqlite(sqlite_template, path)
    writer = RecordWriter(url, _config(tmp_path))
    await writer.start()
    before = [make_record() for _ in range(40)]
    await _submit_and_flush(writer, before)
    assert writer.counters().written == 40
    if how == "deleted":
        path.unlink()
    else:
        replacement = tmp_path / "replacement.db"
        shutil.copyfile(sqlite_template, replacement)
        os.replace(replacement, path)
    after = [make_record() for _ in range(25)]
    await _submit_and_flush(writer, after)
    counters = writer.counters()
    await writer.stop()
    stored = db_helpers.stored_ids(url)
    # Only what is in the file at the path counts as written; the 40 rows went with the old file.
    assert sorted(stored) == sorted(item.request_id for item in after)
    assert (counters.written, counters.lost, counters.database_recreated) == (25, 40, 1)
    assert counters.accepted == counters.written + counters.lost + counters.queued + counters.pending_spill
    db_helpers.assert_rollups_match_requests(url)


async def test_a_file_that_is_no_database_is_counted_and_logged_once_however_often_recreating_fails(
    sqlite_template: Path, tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace, caplog, monkeypatch
) -> None:
    """The SQLite file is replaced by a file that is no database: recreating the database there fails on every
    retry, but the event is counted and logged once. The records stay in the spill file for a database at the path."""
    import db.migrate

    path = tmp_path / "prefixscope.db"
    url = _sqlite(sqlite_template, path)
    attempts = {"n": 0}
    real_upgrade = db.migrate.upgrade_async

    async def counting_upgrade(database_url: str) -> None:
        attempts["n"] += 1
        await real_upgrade(database_url)

    monkeypatch.setattr(db.migrate, "upgrade_async", counting_upgrade)
    writer = RecordWriter(url, _config(tmp_path, replay_interval_s=0.02))
    await writer.start()
    await _submit_and_flush(writer, [make_record() for _ in range(10)])
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"this is not a database\n" * 1000)
    os.replace(garbage, path)
    later = [make_record() for _ in range(5)]
    await _submit_and_flush(writer, later)
    for _ in range(1000):  # bounded: the writer retries every 20 ms
        if attempts["n"] >= 4:
            break
        await asyncio.sleep(0.01)
    assert attempts["n"] >= 4
    counters = writer.counters()
    assert (counters.database_recreated, counters.lost, counters.written, counters.pending_spill) == (1, 10, 0, 5)
    reports = [r for r in caplog.records if r.levelname == "ERROR" and "deleted or replaced" in r.getMessage()]
    assert len(reports) == 1
    await writer.stop()  # the last replay fails too: the 5 records stay in the spill file
    counters = writer.counters()
    assert (counters.database_recreated, counters.lost, counters.pending_spill) == (1, 10, 5)
    assert len([r for r in caplog.records if "deleted or replaced" in r.getMessage()]) == 1
    path.unlink()
    db.migrate.upgrade(url)
    survivor = RecordWriter(url, _config(tmp_path))
    await survivor.start()
    await survivor.stop()
    assert (survivor.counters().replayed, survivor.counters().pending_spill) == (5, 0)
    assert sorted(db_helpers.stored_ids(url)) == sorted(r.request_id for r in later)


def _fail_writes_after(spill: SpillFile, num_bytes: int) -> dict[str, int]:
    """Make the spill file's writes put `num_bytes` on disk, then fail with ENOSPC (a disk that fills up)."""
    state = {"left": num_bytes, "failures": 0}

    def write(fd: int, data: bytes) -> int:
        if state["left"] <= 0:
            state["failures"] += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        count = min(len(data), state["left"])
        state["left"] -= count
        return os.write(fd, bytes(data[:count]))

    spill.write = write  # type: ignore[method-assign]
    return state


def _journal_lines(spill_path: Path) -> list[str]:
    return [
        line
        for path in sorted(spill_path.parent.glob(spill_path.name + ".journal.*"))
        for line in Journal.read_lines(path)
    ]


@pytest.mark.parametrize("durability", ["queue_first", "spill_first"])
async def test_full_database_and_full_spill_disk_count_exactly_what_is_lost(
    durability: str, sqlite_template: Path, tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    """The database file hits its size limit (SQLITE_FULL), so records spill; the spill disk fills up mid-append.
    queue_first: the batch is lost, whole (no torn line left), counted and logged. spill_first: the batch is in the
    journal already, so nothing is lost: its journal segment stays unresolved (`journaled_pending`) and the records
    reach the spill file once it has room. Once there is room again nothing else is lost."""
    url = _sqlite(sqlite_template, tmp_path / "full.db")
    engine = create_async_engine_for(url)

    @event.listens_for(engine.sync_engine, "connect")
    def limit_size(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA page_count")
        pages = cursor.fetchone()[0]
        cursor.execute(f"PRAGMA max_page_count = {pages}")  # no room to grow: "database or disk is full"
        cursor.close()

    writer = RecordWriter(url, _config(tmp_path, batch_size=1000, durability=durability), engine=engine)
    await writer.start()
    spilled_first = [make_record(prompt_text="x" * 5000) for _ in range(30)]  # more than the free pages hold
    await _submit_and_flush(writer, spilled_first)
    assert (writer.counters().spilled, writer.counters().written) == (30, 0)
    spill_path = writer.config.spill_path
    size_before = spill_path.stat().st_size

    state = _fail_writes_after(writer._spill, 700)  # part of one record, then ENOSPC
    lost = [make_record() for _ in range(20)]
    await _submit_and_flush(writer, lost)
    assert state["failures"] == 1
    assert spill_path.stat().st_size == size_before  # whole or absent: the partial write was cut back
    counters = writer.counters()
    if durability == "spill_first":
        assert (counters.lost, counters.journaled_pending) == (0, 20)
        assert [json.loads(line)["request_id"] for line in _journal_lines(spill_path)] == [r.request_id for r in lost]
    else:
        assert (counters.lost, counters.journaled_pending) == (20, 0)
    writer._spill.write = os.write  # type: ignore[method-assign]
    spilled_after = [make_record() for _ in range(10)]
    await _submit_and_flush(writer, spilled_after)
    counters = writer.counters()
    assert (counters.spilled, counters.lost, counters.written) == (40, 20 if durability == "queue_first" else 0, 0)
    lines = spill_path.read_text().splitlines()
    assert [json.loads(line)["request_id"] for line in lines] == [r.request_id for r in spilled_first + spilled_after]
    kept = lost if durability == "spill_first" else []

    event.remove(engine.sync_engine, "connect", limit_size)
    await engine.dispose()  # the disk has room again: new connections have no size limit
    await writer.stop()
    await engine.dispose()
    counters = writer.counters()
    if durability == "spill_first":  # at stop the 20 records kept in the journal are retried: the database takes them
        assert (counters.written, counters.lost, counters.journaled_pending) == (20, 0, 0)
    else:
        assert (counters.written, counters.lost, counters.journaled_pending) == (0, 20, 0)
    assert (counters.replayed, counters.spilled, counters.rejected, counters.pending_spill) == (40, 40, 0, 0)
    assert counters.accepted == counters.written + counters.replayed + counters.lost
    assert sorted(db_helpers.stored_ids(url)) == sorted(r.request_id for r in spilled_first + spilled_after + kept)
    assert _journal_lines(spill_path) == []


async def test_spill_first_records_not_journaled_either_are_the_ones_lost(
    tmp_path: Path, make_record: MakeRecord, monkeypatch
) -> None:
    """spill_first with the journal, the database and the spill file all failing: only then is a record lost."""
    url = "sqlite:///" + str(tmp_path / "no" / "such.db")  # a directory that does not exist: unavailable
    writer = RecordWriter(url, _config(tmp_path, durability="spill_first"))
    await writer.start()
    _fail_writes_after(writer._spill, 0)
    journaled = [make_record() for _ in range(5)]
    await _submit_and_flush(writer, journaled)

    def fail(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("db.journal.write_all", fail)
    unjournaled = [make_record() for _ in range(3)]
    await _submit_and_flush(writer, unjournaled)
    counters = writer.counters()
    assert (counters.lost, counters.journaled_pending, counters.journal_failures) == (3, 5, 3)
    assert [json.loads(line)["request_id"] for line in _journal_lines(writer.config.spill_path)] == [
        r.request_id for r in journaled
    ]
    for task in (writer._task, writer._sync_task):  # a process that dies: the journal is left for the next start
        assert task is not None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_a_torn_tail_is_cut_before_the_next_append(tmp_path: Path, make_record: MakeRecord, monkeypatch) -> None:
    """When even cutting back fails, the torn tail stays until the next append, which cuts it first: the next record
    is never glued to a broken line."""
    import db.spill

    spill = SpillFile(tmp_path / "spill.jsonl")
    kept = make_record()
    spill.append([kept])
    _fail_writes_after(spill, 50)
    real_ftruncate = os.ftruncate
    calls = {"n": 0}

    def ftruncate_failing_once(fd: int, length: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EIO, "I/O error")
        real_ftruncate(fd, length)

    monkeypatch.setattr(db.spill.os, "ftruncate", ftruncate_failing_once)
    with pytest.raises(OSError):
        spill.append([make_record()])
    assert not spill.path.read_bytes().endswith(b"\n")  # a torn tail is on disk
    assert spill.read_chunk(10).records == [kept]  # replay does not consume the torn tail
    spill.write = os.write  # type: ignore[method-assign]
    after = make_record()
    spill.append([after])
    assert spill.torn_tails_cut == 1
    lines = spill.path.read_text().splitlines()
    assert [json.loads(line)["request_id"] for line in lines] == [kept.request_id, after.request_id]
    assert spill.pending == 2


async def test_spill_first_journal_survives_a_writer_that_never_stopped(
    sqlite_template: Path, tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    """spill_first: records are in the journal before they are queued. A process that dies (the writer is never
    stopped, its queue never written) leaves them there, and the next writer replays them: nothing is lost."""
    url = _sqlite(sqlite_template, tmp_path / "journal.db")
    config = _config(tmp_path, durability="spill_first", flush_interval_s=60.0, batch_size=10_000)
    dying = RecordWriter(url, config)
    records = [make_record() for _ in range(50)]
    for item in records:
        assert dying.submit(item)  # queued only: the writer task never ran
    segments = Journal(config.spill_path).leftover_paths()
    assert sum(len(Journal.read_lines(path)) for path in segments) == 50

    survivor = RecordWriter(url, _config(tmp_path, durability="spill_first"))
    await survivor.start()
    await survivor.stop()
    assert sorted(db_helpers.stored_ids(url)) == sorted(item.request_id for item in records)
    assert survivor.counters().replayed == 50
    assert Journal(config.spill_path).leftover_paths() == []


async def test_spill_first_removes_journal_segments_once_their_records_are_home(
    sqlite_template: Path, tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    url = _sqlite(sqlite_template, tmp_path / "journal.db")
    writer = RecordWriter(url, _config(tmp_path, durability="spill_first"))
    writer._journal.segment_bytes = 4096  # type: ignore[union-attr]  # several segments
    await writer.start()
    records = [make_record() for _ in range(60)]
    await _submit_and_flush(writer, records)
    directory = writer.config.spill_path.parent
    assert sum(len(Journal.read_lines(p)) for p in directory.glob("requests.jsonl.journal.*")) == 0
    await writer.stop()
    assert list(directory.glob("requests.jsonl.journal.*")) == []
    assert writer.counters().written == 60 and writer.counters().journal_failures == 0
    assert sorted(db_helpers.stored_ids(url)) == sorted(item.request_id for item in records)


def test_rejected_records_are_kept_private_like_the_spill_file(tmp_path: Path, make_record: MakeRecord) -> None:
    """The `.rejected` file holds the same records as the spill file (prompt text included when stored), so it is
    created owner-only (0600) like the spill file and the journal, whatever the umask."""
    old_umask = os.umask(0o022)
    try:
        spill = SpillFile(tmp_path / "spill.jsonl")
        spill.append([make_record()])
        spill.reject([make_record().to_json()])
    finally:
        os.umask(old_umask)
    assert spill.path.stat().st_mode & 0o777 == 0o600
    assert spill.rejected_path.stat().st_mode & 0o777 == 0o600


async def test_a_journal_left_by_a_dead_process_does_not_stop_a_start_on_a_full_disk(
    sqlite_template: Path, tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    """After a SIGKILL the next start moves the journal into the spill file. If the disk is full then, the writer
    still starts (the gateway serves degraded), the segment stays where it is, and its records are moved and
    replayed once there is room: nothing is lost."""
    url = _sqlite(sqlite_template, tmp_path / "journal.db")
    config = _config(tmp_path, durability="spill_first", flush_interval_s=60.0, batch_size=10_000)
    dying = RecordWriter(url, config)
    records = [make_record() for _ in range(20)]
    for item in records:
        assert dying.submit(item)
    (segment,) = Journal(config.spill_path).leftover_paths()

    survivor = RecordWriter(url, _config(tmp_path, durability="spill_first", replay_interval_s=0.01))
    state = _fail_writes_after(survivor._spill, 100)  # the disk fills up part-way through the move
    await survivor.start()  # does not raise
    await asyncio.sleep(0.05)
    assert state["failures"] >= 1
    assert segment.exists() and len(Journal.read_lines(segment)) == 20  # still there, whole
    survivor._spill.write = os.write  # type: ignore[method-assign]  # room again
    for _ in range(200):
        if not segment.exists():
            break
        await asyncio.sleep(0.01)
    await survivor.stop()
    assert sorted(db_helpers.stored_ids(url)) == sorted(item.request_id for item in records)
    assert survivor.counters().lost == 0
    assert Journal(config.spill_path).leftover_paths() == []


def test_a_torn_spill_tail_on_a_full_disk_does_not_stop_a_start(
    tmp_path: Path, make_record: MakeRecord, monkeypatch
) -> None:
    """A process died mid-append and left a torn last line; the next start cannot end that line because the disk
    is full. Opening the spill file must not fail (the writer, and the gateway with it, would not start): the torn
    tail is left out of replay and cut before the next append."""
    import db.spill

    path = tmp_path / "spill.jsonl"
    kept = make_record()
    path.write_text(kept.to_json() + "\n" + make_record().to_json()[:40])

    def full(fd: int, payload: bytes, write: object = None) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(db.spill, "write_all", full)
    spill = SpillFile(path)  # does not raise
    assert spill.pending == 1
    chunk = spill.read_chunk(10)
    assert (chunk.records, chunk.bad_lines) == ([kept], [])
    monkeypatch.undo()
    after = make_record()
    spill.append([after])
    assert spill.torn_tails_cut == 1
    assert [json.loads(line)["request_id"] for line in path.read_text().splitlines()] == [
        kept.request_id,
        after.request_id,
    ]
