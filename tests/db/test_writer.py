"""The record writer: batching, counting, dropping on a full queue, spilling, replaying without duplicates."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from db.chains import RequestChain
from db.engine import create_async_engine_for, create_sync_engine_for
from db.migrate import upgrade
from db.records import RequestRecord
from db.spill import SpillFile
from db.store import CHAINS, row_to_chain, store_records
from db.writer import RecordWriter, WriterConfig

MakeRecord = Callable[..., RequestRecord]
CLOSED_PORT_URL = "postgresql://postgres@127.0.0.1:1/prefixscope_unreachable"


def _config(tmp_path: Path, **overrides: object) -> WriterConfig:
    values: dict[str, object] = {
        # These tests were written against the writer's own former defaults; they keep them.
        "queue_size": 10_000,
        "batch_size": 500,
        "durability": "queue_first",
        "spill_path": tmp_path / "spill" / "requests.jsonl",
        "flush_interval_s": 0.01,
        "replay_interval_s": 60.0,  # tests that want the periodic probe lower it
    }
    values.update(overrides)
    return WriterConfig(**values)  # type: ignore[arg-type]


def _varied(make_record: MakeRecord, count: int) -> list[RequestRecord]:
    """Records over several hours, tenants, hit states, rules, miss reasons, prefixes and chains."""
    return [
        make_record(
            created_at=make_record().created_at + timedelta(minutes=17 * index),
            tenant=("acme", "globex")[index % 2],
            cached_tokens=(None, 0, 64)[index % 3],
            ttft_ms=float(10 + index),
            applied_rules=(("canonical_tool_order",), ())[index % 2],
            miss_kind=(None, "cold", "partial")[index % 3],
            prefix_hash=(None, "p1", "p2", "p1")[index % 4],
            miss_reason=(None, "new_prefix", "tools_changed", "volatile_value")[index % 4],
            divergence_segment=(None, None, "tools", "system")[index % 4],
            divergence_char_offset=(None, None, 70 * index, 40)[index % 4],
            recomputed_tokens=(None, 0, 36, 20)[index % 4],
            normalization_gain_tokens=(None, 0, 48)[index % 3],
            chain=RequestChain(16, 100, tuple(range(index, index + 6)), approximate=index % 2 == 0)
            if index % 5 == 0
            else None,
        )
        for index in range(count)
    ]


def _stored_chains(url: str) -> dict[str, RequestChain]:
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(CHAINS))
            return {row.request_id: row_to_chain(row) for row in rows}
    finally:
        engine.dispose()


def _assert_chains_stored(url: str, records: list[RequestRecord]) -> None:
    assert _stored_chains(url) == {item.request_id: item.chain for item in records if item.chain is not None}


async def _wait_until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll until `predicate()` holds; fail (not hang) if it never does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            pytest.fail("condition not reached")
        await asyncio.sleep(0.02)


async def test_writes_in_batches_with_rollups(
    db_url: str, tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    writer = RecordWriter(db_url, _config(tmp_path, batch_size=7))
    records = _varied(make_record, 50)
    assert all(writer.submit(item) for item in records)
    assert writer.counters().queued == 50
    await writer.start()
    await writer.flush()
    counters = writer.counters()
    assert (counters.accepted, counters.written, counters.queued, counters.spilled) == (50, 50, 0, 0)
    assert counters.batches == 8  # ceil(50 / 7): the queue was full before the task started
    await writer.stop()
    assert sorted(db_helpers.stored_ids(db_url)) == sorted(item.request_id for item in records)
    _assert_chains_stored(db_url, records)
    db_helpers.assert_rollups_match_requests(db_url)


async def test_full_queue_drops_and_counts(db_url: str, tmp_path: Path, make_record: MakeRecord) -> None:
    writer = RecordWriter(db_url, _config(tmp_path, queue_size=5))
    results = [writer.submit(make_record()) for _ in range(8)]
    assert results == [True] * 5 + [False] * 3
    assert (writer.counters().queued, writer.counters().dropped) == (5, 3)
    await writer.stop()  # a writer that never started still drains what it accepted
    assert writer.counters().written == 5
    assert writer.submit(make_record()) is False  # closed: refused and counted
    assert writer.counters().dropped == 4


async def test_spills_while_unreachable_and_replays_once_fixed(
    tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    url = f"sqlite:///{tmp_path / 'not-yet' / 'prefixscope.db'}"
    writer = RecordWriter(url, _config(tmp_path))
    await writer.start()
    first = _varied(make_record, 30)
    for item in first:
        writer.submit(item)
    await writer.flush()
    counters = writer.counters()
    assert (counters.written, counters.spilled, counters.pending_spill) == (0, 30, 30)
    assert not counters.database_available
    assert len(writer.config.spill_path.read_text().splitlines()) == 30

    upgrade(url)  # creates the directory and the schema: the database is back
    second = _varied(make_record, 10)
    for item in second:
        writer.submit(item)
    await writer.stop()  # drains the queue, then replays everything the database now takes

    counters = writer.counters()
    assert counters.accepted == 40 and counters.dropped == 0 and counters.lost == 0
    assert counters.pending_spill == 0
    assert counters.written + counters.replayed == 40
    stored = db_helpers.stored_ids(url)
    assert len(stored) == len(set(stored)) == 40
    assert set(stored) == {item.request_id for item in first + second}
    assert writer.config.spill_path.read_text() == ""
    _assert_chains_stored(url, first + second)  # chains travel through the spill file
    db_helpers.assert_rollups_match_requests(url)


async def test_running_writer_probes_and_replays_by_itself(
    tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    url = f"sqlite:///{tmp_path / 'later' / 'prefixscope.db'}"
    writer = RecordWriter(url, _config(tmp_path, replay_interval_s=0.05))
    await writer.start()
    records = _varied(make_record, 12)
    for item in records:
        writer.submit(item)
    await writer.flush()
    assert writer.counters().pending_spill == 12
    await asyncio.to_thread(upgrade, url)
    await _wait_until(lambda: writer.counters().pending_spill == 0)
    assert writer.counters().replayed == 12 and writer.counters().database_available
    late = make_record()
    writer.submit(late)
    await writer.flush()
    assert writer.counters().written == 1  # healthy again: straight to the database
    await writer.stop()
    assert sorted(db_helpers.stored_ids(url)) == sorted(item.request_id for item in [*records, late])


async def test_closed_postgres_port_spills_and_a_later_writer_replays(
    db_url: str, tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    down = RecordWriter(CLOSED_PORT_URL, _config(tmp_path))
    records = _varied(make_record, 25)
    await down.start()
    for item in records:
        down.submit(item)
    await down.stop()
    assert (down.counters().spilled, down.counters().pending_spill, down.counters().written) == (25, 25, 0)

    # A new process finds the spill file at start-up and replays it into the (working) database.
    up = RecordWriter(db_url, _config(tmp_path))
    assert up.counters().pending_spill == 25
    await up.start()
    await up.stop()
    assert up.counters().replayed == 25 and up.counters().pending_spill == 0
    stored = db_helpers.stored_ids(db_url)
    assert sorted(stored) == sorted(item.request_id for item in records)
    db_helpers.assert_rollups_match_requests(db_url)


async def test_replay_skips_records_already_stored(
    db_url: str, tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    # A commit whose acknowledgement was lost: the rows are in the database and also in the spill file.
    committed = _varied(make_record, 10)
    engine = create_sync_engine_for(db_url)
    with engine.begin() as conn:
        store_records(conn, committed)
    engine.dispose()
    rollups_before = db_helpers.rollup_snapshot(db_url)
    fresh = _varied(make_record, 5)
    spill_path = tmp_path / "spill" / "requests.jsonl"
    spill_path.parent.mkdir(parents=True)
    lines = [item.to_json() for item in [*committed, *fresh, committed[0]]]
    spill_path.write_text("\n".join(lines) + "\n")

    writer = RecordWriter(db_url, _config(tmp_path))
    assert writer.counters().pending_spill == 16
    await writer.start()
    await writer.stop()
    assert writer.counters().replayed == 16 and writer.counters().pending_spill == 0
    stored = db_helpers.stored_ids(db_url)
    assert len(stored) == len(set(stored)) == 15
    assert db_helpers.rollup_snapshot(db_url) != rollups_before  # the five new ones were added...
    db_helpers.assert_rollups_match_requests(db_url)  # ...and the ten old ones not counted twice
    _assert_chains_stored(db_url, committed + fresh)


async def test_a_record_the_database_refuses_is_set_aside(
    db_url: str, backend: str, tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    good = [make_record(), make_record()]
    # PostgreSQL refuses a token count past INTEGER; SQLite stores any integer, so give it a status it cannot use.
    bad = make_record(prompt_tokens=2**40) if backend == "postgresql" else make_record(status_code="teapot")
    writer = RecordWriter(db_url, _config(tmp_path))
    for item in (good[0], bad, good[1]):
        writer.submit(item)
    await writer.start()
    await writer.stop()
    counters = writer.counters()
    assert (counters.written, counters.rejected, counters.spilled) == (2, 1, 0)
    assert sorted(db_helpers.stored_ids(db_url)) == sorted(item.request_id for item in good)
    rejected_file = writer.config.spill_path.with_name("requests.jsonl.rejected")
    assert json.loads(rejected_file.read_text())["request_id"] == bad.request_id


async def test_torn_spill_line_is_rejected_and_the_rest_replayed(
    db_url: str, tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    kept = make_record()
    spill_path = tmp_path / "spill" / "requests.jsonl"
    spill_path.parent.mkdir(parents=True)
    spill_path.write_text(kept.to_json() + "\n" + kept.to_json()[:40])  # a crash mid-append
    writer = RecordWriter(db_url, _config(tmp_path))
    writer.submit(make_record())
    await writer.start()
    await writer.stop()
    counters = writer.counters()
    assert (counters.replayed, counters.rejected, counters.pending_spill, counters.written) == (1, 1, 0, 1)
    assert kept.request_id in db_helpers.stored_ids(db_url)
    assert spill_path.read_text() == ""


async def test_flush_needs_a_running_writer(db_url: str, tmp_path: Path) -> None:
    writer = RecordWriter(db_url, _config(tmp_path))
    with pytest.raises(RuntimeError):
        await writer.flush()


async def test_a_locked_sqlite_database_spills_rather_than_rejects(
    sqlite_template: Path, tmp_path: Path, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    db_path = tmp_path / "locked.db"
    shutil.copyfile(sqlite_template, db_path)
    db_url = f"sqlite:///{db_path}"
    engine = create_async_engine_for(db_url, busy_timeout_ms=50)
    writer = RecordWriter(db_url, _config(tmp_path), engine=engine)
    records = [make_record() for _ in range(4)]
    blocker = create_sync_engine_for(db_url)
    try:
        with blocker.connect() as lock:
            lock.exec_driver_sql("BEGIN IMMEDIATE")  # another process holds the write lock (a long bulk load)
            await writer.start()
            for item in records:
                writer.submit(item)
            await writer.flush()
            counters = writer.counters()
            assert (counters.spilled, counters.rejected, counters.written) == (4, 0, 0)
            lock.exec_driver_sql("ROLLBACK")
        await writer.stop()
    finally:
        blocker.dispose()
        await engine.dispose()
    assert writer.counters().replayed == 4
    assert sorted(db_helpers.stored_ids(db_url)) == sorted(item.request_id for item in records)


def test_spill_file_counts_survive_restarts_and_external_removal(tmp_path: Path, make_record: MakeRecord) -> None:
    path = tmp_path / "spill.jsonl"
    first = SpillFile(path)
    first.append([make_record(), make_record()])
    assert SpillFile(path).pending == 2  # a new process sees what the last one left
    chunk = first.read_chunk(1)
    first.advance(chunk)
    assert first.pending == 1 and path.read_text().count("\n") == 2  # nothing is cut until everything is stored
    first.advance(first.read_chunk(10))
    assert first.pending == 0 and path.read_text() == ""
    first.append([make_record()])
    path.unlink()  # removed by an operator: nothing left to wait for
    first.advance(first.read_chunk(10))
    assert first.pending == 0
