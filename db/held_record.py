"""`HeldRecord`: a finished request's record that a sink holds back to add to it before it is stored.

The rule advisor holds a record until its estimates are attached, the uplift check until its gain is measured. The
client has its answer already, so the record must be as safe as one submitted at once: `RecordWriter.hold` journals
it (spill_first) when the request finishes, and `complete` submits the completed version exactly once, through the
writer's ordinary `submit` (journaled and queued in its turn, stored once, counted once), then releases the held
journal line. A crash before `complete` replays the held version at the next start.
"""

from __future__ import annotations

from collections.abc import Callable

from db.records import RequestRecord

__all__ = ["HeldRecord"]


def _nothing_to_release() -> None:
    pass


class HeldRecord:
    """One held record: `complete(record)` submits its completed version, once.

    `submit` is the writer's (returns False when the record was dropped, and counts it); `release` is called once the
    completed version is submitted, whatever happened to it."""

    __slots__ = ("request_id", "_submit", "_release", "completed")

    def __init__(
        self,
        request_id: str,
        submit: Callable[[RequestRecord], bool],
        release: Callable[[], None] = _nothing_to_release,
    ) -> None:
        self.request_id = request_id
        self._submit = submit
        self._release = release
        self.completed = False

    def complete(self, record: RequestRecord) -> bool:
        """Submit the completed record (the held one with what the sink added); what `submit` returns.

        Raises ValueError for a record of another request and RuntimeError when called a second time."""
        if record.request_id != self.request_id:
            raise ValueError(f"held record {self.request_id} completed with record {record.request_id}")
        if self.completed:
            raise RuntimeError(f"held record {self.request_id} is already completed")
        self.completed = True
        try:
            return self._submit(record)
        finally:
            self._release()
