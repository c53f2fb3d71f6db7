"""The record writer's settings and counters (see `db.writer`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

# How a record reaches disk: "queue_first" records wait in memory for the next batch; "spill_first" records are
# appended to a journal beside the spill file before they are queued (see docs on recording durability).
DURABILITY_MODES: Final = ("queue_first", "spill_first")
DEFAULT_SPILL_PATH: Final = Path("var/spill/gateway_requests.jsonl")


@dataclass(frozen=True)
class WriterConfig:
    """Settings of a `RecordWriter`: the gateway's `[recorder]` section of `prefixscope.toml`, one key per field.

    Raises ValueError from the constructor for a size below 1, an interval that is not positive or an unknown
    durability mode."""

    queue_size: int = 50_000  # records
    # Large batches let the writer keep up when the event loop is saturated: each batch costs a fixed number of
    # round trips through the loop, whatever its size. At modest rates batches stay small (one per interval).
    batch_size: int = 2048  # records per transaction, at most
    flush_interval_s: float = 0.25
    spill_path: Path = DEFAULT_SPILL_PATH
    replay_interval_s: float = 5.0
    replay_batch_size: int = 2_000  # records per replayed chunk of the spill file
    # Longer than any healthy batch; a write that hangs past this is treated as the database being unavailable.
    write_timeout_s: float = 30.0
    # spill_first (the default): a record is appended to the journal next to the spill file before it is queued (it
    # adds about 0.02 ms to the request path, see `prefixscope bench gateway`), and the journal is fsynced every
    # `journal_fsync_interval_s`. queue_first: a record waits in memory and reaches disk (database or spill file)
    # within a batch interval.
    durability: str = "spill_first"
    journal_fsync_interval_s: float = 0.005

    def __post_init__(self) -> None:
        for name in ("queue_size", "batch_size", "replay_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {self.durability!r}")
        for name in ("flush_interval_s", "replay_interval_s", "write_timeout_s", "journal_fsync_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


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
