"""The record writer's settings and counters (see `db.writer`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class WriterConfig:
    """Settings of a `RecordWriter`."""

    database_url: str
    queue_size: int = 10_000
    batch_size: int = 500
    flush_interval_s: float = 0.2
    spill_path: Path = field(default_factory=lambda: Path("var/spill/requests.jsonl"))
    replay_interval_s: float = 5.0
    replay_batch_size: int = 2_000
    # Longer than any healthy batch; a write that hangs past this is treated as the database being unavailable.
    write_timeout_s: float = 30.0
    # "queue_first": records wait in memory for the next batch. "spill_first": each record is appended to a journal
    # beside the spill file before it is queued, and the journal is fsynced every `journal_fsync_interval_s`.
    durability: str = "queue_first"
    journal_fsync_interval_s: float = 0.005

    def __post_init__(self) -> None:
        for name in ("queue_size", "batch_size", "replay_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"WriterConfig.{name} must be at least 1")
        if self.durability not in ("queue_first", "spill_first"):
            raise ValueError(f"WriterConfig.durability must be queue_first or spill_first, not {self.durability!r}")
        for name in ("flush_interval_s", "replay_interval_s", "write_timeout_s", "journal_fsync_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"WriterConfig.{name} must be positive")


@dataclass(frozen=True)
class WriterCounters:
    """Counts since the writer was created. `queued` and `pending_spill` are current levels, the rest totals.

    Every accepted record is in exactly one place, so with an empty spill file at the start:
    accepted == queued + written + pending_spill + replayed + rejected + lost +
    journaled_pending. `spilled` counts records that went
    through the spill file (each is then pending, replayed or rejected); `dropped` records were never accepted.
    `written` and `replayed` count rows in the database file at the configured path: rows stored into a SQLite file
    that was then deleted or replaced move to `lost` when that is noticed (`database_recreated` counts the times).
    """

    queued: int
    written: int
    spilled: int
    replayed: int
    dropped: int
    pending_spill: int
    accepted: int = 0
    rejected: int = 0
    lost: int = 0
    batches: int = 0  # transactions that stored records (direct writes and replayed chunks)
    database_available: bool = True
    database_recreated: int = 0
    journal_failures: int = 0  # spill_first: records that could not be journaled (they were still queued)
    torn_tails_cut: int = 0
    # spill_first: records that the database and the spill file could not take, kept in the journal (a level)
    journaled_pending: int = 0
