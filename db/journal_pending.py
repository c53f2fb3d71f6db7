"""spill_first: journaled records that neither the database nor the spill file could take (a full disk).

Such records are not lost: they are in the journal. Their journal segment stays unresolved, so they are replayed
at the next start like a spill (`Journal.recover_into`), and while the process runs the writer retries them every
`replay_interval_s` (database first, then the spill file). The journal resolves its oldest records in order, so
records handled after them are held unresolved too until the pending ones have a home; if the process dies first,
those are replayed again at the next start and skipped as duplicates (storing is idempotent by request id).
"""

from __future__ import annotations

import logging
from collections import deque

from db.journal import Journal
from db.records import RequestRecord

logger = logging.getLogger("prefixscope.db.journal")


class PendingJournal:
    """The records kept only in the journal, and the journal resolutions held back behind them."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.records: list[RequestRecord] = []
        self._held = 0  # journaled records handled since the first pending one, not yet resolved in the journal

    @staticmethod
    def take_flags(journaled: deque[bool], num_records: int) -> list[bool]:
        """Which of the next `num_records` queued records made it into the journal (in queue order)."""
        return [journaled.popleft() for _ in range(min(num_records, len(journaled)))]

    def keep(self, records: list[RequestRecord], flags: list[bool]) -> int:
        """Keep the journaled ones among `records` pending; returns how many were not journaled (truly lost)."""
        kept = [record for record, journaled in zip(records, flags, strict=False) if journaled]
        self.records.extend(kept)
        return len(records) - len(kept)

    def resolve(self, num_journaled: int) -> None:
        """A batch with `num_journaled` journaled records was handled: resolve them, unless held behind pending ones."""
        if self.records or self._held:
            self._held += num_journaled
            return
        self._resolve(num_journaled)

    def settled(self, remaining: list[RequestRecord]) -> None:
        """A retry gave all but `remaining` of the pending records a home; resolve the journal once none is left."""
        self.records = remaining
        if not remaining:
            held, self._held = self._held, 0
            self._resolve(held)

    def _resolve(self, count: int) -> None:
        try:
            self.journal.resolved(count)
        except OSError:
            logger.exception("could not remove a finished journal segment")
