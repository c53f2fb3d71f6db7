"""Records held back by a sink (`RecordWriter.hold`): journaled from the start under spill_first, stored once in their
completed version, counted once, and replayed after a process that died while holding them."""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from db.journal import Journal
from db.records import RequestRecord
from db.writer import RecordWriter, WriterConfig

MakeRecord = Callable[..., RequestRecord]


def _config(tmp_path: Path, durability: str = "spill_first", **overrides: object) -> WriterConfig:
    values: dict[str, object] = {
        "durability": durability,
        "spill_path": tmp_path / "spill" / "requests.jsonl",
        "flush_interval_s": 0.01,
        "replay_interval_s": 60.0,
    }
    values.update(overrides)
    return WriterConfig(**values)  # type: ignore[arg-type]


def _sqlite(sqlite_template: Path, path: Path) -> str:
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


def _gains(path: Path) -> dict[str, int | None]:
    """request id -> stored `normalization_gain_tokens` (the field the tests' sinks add)."""
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT id, normalization_gain_tokens FROM requests").fetchall())


def _journal_ids(spill_path: Path) -> list[str]:
    return [
        json.loads(line)["request_id"]
        for path in sorted(spill_path.parent.glob(spill_path.name + ".journal.*"))
        for line in Journal.read_lines(path)
    ]


@pytest.mark.parametrize("durability", ["spill_first", "queue_first"])
async def test_hold_then_complete_stores_the_completed_record_once(
    durability: str, sqlite_template: Path, tmp_path: Path, make_record: MakeRecord
) -> None:
    path = tmp_path / "held.db"
    writer = RecordWriter(_sqlite(sqlite_template, path), _config(tmp_path, durability))
    await writer.start()
    record = make_record()
    held = writer.hold(record)
    # Journaled from the start under spill_first (like a submitted record), not queued.
    assert _journal_ids(writer.config.spill_path) == ([record.request_id] if durability == "spill_first" else [])
    assert (writer.counters().held, writer.counters().accepted) == (1, 0)
    assert held.complete(replace(record, normalization_gain_tokens=7))
    with pytest.raises(RuntimeError):
        held.complete(record)  # once only
    await writer.flush()
    counters = writer.counters()
    assert (counters.held, counters.accepted, counters.written, counters.replayed) == (0, 1, 1, 0)
    await writer.stop()
    assert _gains(path) == {record.request_id: 7}
    assert _journal_ids(writer.config.spill_path) == []
    assert list(writer.config.spill_path.parent.glob("*.journal.*")) == []


async def test_a_held_record_keeps_its_journal_segment_while_later_records_are_stored(
    sqlite_template: Path, tmp_path: Path, make_record: MakeRecord
) -> None:
    path = tmp_path / "held.db"
    writer = RecordWriter(_sqlite(sqlite_template, path), _config(tmp_path))
    writer._journal.segment_bytes = 4096  # type: ignore[union-attr]  # several segments
    await writer.start()
    record = make_record()
    held = writer.hold(record)
    others = [make_record() for _ in range(40)]
    for other in others:
        assert writer.submit(other)
    await writer.flush()
    assert record.request_id in _journal_ids(writer.config.spill_path)  # its segment stays while it is held
    held.complete(replace(record, normalization_gain_tokens=3))
    await writer.flush()
    assert _journal_ids(writer.config.spill_path) == []
    await writer.stop()
    assert _gains(path)[record.request_id] == 3 and len(_gains(path)) == 41
    assert writer.counters().written == 41


async def test_held_records_of_a_process_that_died_are_replayed_once(
    sqlite_template: Path, tmp_path: Path, make_record: MakeRecord
) -> None:
    """The process dies (the writer is never started nor stopped) with three records held, one of them completed
    (journaled again, queued, never written): the next writer stores each once, the completed one completed."""
    path = tmp_path / "held.db"
    url = _sqlite(sqlite_template, path)
    config = _config(tmp_path, flush_interval_s=60.0)
    dying = RecordWriter(url, config)
    records = [make_record() for _ in range(3)]
    handles = [dying.hold(record) for record in records]
    assert handles[1].complete(replace(records[1], normalization_gain_tokens=5))
    assert sorted(_journal_ids(config.spill_path)) == sorted([r.request_id for r in records] + [records[1].request_id])

    survivor = RecordWriter(url, _config(tmp_path))
    await survivor.start()
    await survivor.stop()
    assert _gains(path) == {records[0].request_id: None, records[1].request_id: 5, records[2].request_id: None}
    counters = survivor.counters()
    assert (counters.replayed, counters.rejected, counters.lost) == (3, 0, 0)  # one count per record
    assert Journal(config.spill_path).leftover_paths() == []


async def test_stopping_with_a_record_still_held_keeps_it_for_the_next_start(
    sqlite_template: Path, tmp_path: Path, make_record: MakeRecord, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "held.db"
    url = _sqlite(sqlite_template, path)
    writer = RecordWriter(url, _config(tmp_path))
    await writer.start()
    record = make_record()
    writer.hold(record)  # a sink that never completes it
    with caplog.at_level(logging.ERROR, logger="prefixscope.db.writer"):
        await writer.stop()
    assert any("stay in the journal" in r.getMessage() for r in caplog.records)
    assert _gains(path) == {}
    survivor = RecordWriter(url, _config(tmp_path))
    await survivor.start()
    await survivor.stop()
    assert _gains(path) == {record.request_id: None}
    assert survivor.counters().replayed == 1
