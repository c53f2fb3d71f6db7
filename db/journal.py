"""The write-ahead journal of the `spill_first` durability mode: records on local disk before they are queued.

`append` writes one record (a JSON line, the spill file's format) to the current segment file with one `write`
call, on the request path; it does not fsync. A background task calls `sync` every few milliseconds, which fsyncs
the segments written since the last call. So a record is in the kernel's page cache (it survives a SIGKILL or a
crash of the process) before the request is answered, and on the disk (it survives a power cut or a kernel crash)
within one sync interval.

The writer handles queued records in order, so "the oldest `n` journaled records are resolved" (stored, spilled,
rejected or counted lost) is all it reports (`resolved`); a segment whose records are all resolved is deleted. Records
that nothing else could take stay unresolved (`db.journal_pending`), and so do the ones after them. A
segment grows to `segment_bytes`, then a new one starts. Segments left by a process that died are recovered at the
next start (`leftover_lines`) and replayed through the spill file; storing is idempotent by request id, so records
that had been stored already are skipped.

A record held back by a sink (rule advice estimates, an uplift check) is not queued until the sink completes it, so it
is outside that order: `append_held` writes it and pins its segment, which is kept (neither deleted nor started over)
until `release` unpins it, once the completed version is appended in its turn. So a crash while a record is held
loses nothing either. At the next start `recover_into` keeps only the last line of each request id: a record journaled
both held and completed is replayed once, completed.

Used from one event loop; only `sync` runs in a worker thread, on duplicated file descriptors.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import msgspec

from db.spill import SpillFile, cut_torn_tail, write_all

logger = logging.getLogger("prefixscope.db.journal")

SEGMENT_BYTES = 8 << 20


@dataclass
class _Segment:
    path: Path
    fd: int
    num_records: int = 0  # queued records, resolved in order
    num_bytes: int = 0
    pins: int = 0  # held records written here and not released yet: the segment stays while any is


class Journal:
    """Segment files `<name>.journal.<n>` in the directory of `base_path` (see the module docstring)."""

    def __init__(self, base_path: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.base_path = base_path
        self.segment_bytes = segment_bytes
        self._segments: deque[_Segment] = deque()
        self._dirty: set[int] = set()
        self._next_index = 0
        self._resolved = 0
        self.failed_appends = 0
        self._written = asyncio.Event()  # set by append: an idle journal costs no wake-ups

    # -- start-up ---------------------------------------------------------------------------------------------

    def _pattern(self) -> str:
        return self.base_path.name + ".journal."

    def leftover_paths(self) -> list[Path]:
        """Segments in the directory that this journal did not open (a previous process's), oldest first."""
        directory = self.base_path.parent
        if not directory.exists():
            return []
        own = {segment.path for segment in self._segments}
        found = []
        for path in directory.iterdir():
            suffix = path.name[len(self._pattern()) :]
            if path.name.startswith(self._pattern()) and suffix.isdigit() and path not in own:
                found.append((int(suffix), path))
        return [path for _, path in sorted(found)]

    @staticmethod
    def read_lines(path: Path) -> list[str]:
        """The complete lines of a segment (a torn last line, cut short by a crash, is left out)."""
        data = path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        return [line for line in complete.decode("utf-8", errors="replace").splitlines() if line.strip()]

    # -- the request path -------------------------------------------------------------------------------------

    def append(self, line: str) -> bool:
        """Write one record's JSON line; False (logged, counted) when the write failed and the record is not in it."""
        segment = self._write(line)
        if segment is None:
            return False
        segment.num_records += 1
        return True

    def append_held(self, line: str) -> _Segment | None:
        """Write the line of a record a sink holds back; its segment stays until `release(segment)`. None (logged,
        counted) when the write failed: then there is nothing to release."""
        segment = self._write(line)
        if segment is not None:
            segment.pins += 1
        return segment

    def release(self, segment: _Segment) -> None:
        """A held record written to `segment` is journaled in its completed version now (or has a home)."""
        segment.pins -= 1
        if segment.pins == 0:
            self.resolved(0)

    def _write(self, line: str) -> _Segment | None:
        segment = self._current()
        payload = (line + "\n").encode("utf-8")
        try:
            if segment is None:
                raise OSError("no journal segment could be opened")
            write_all(segment.fd, payload)
        except OSError as exc:
            self.failed_appends += 1
            if segment is not None:
                try:
                    os.ftruncate(segment.fd, segment.num_bytes)
                except OSError:
                    try:
                        cut_torn_tail(segment.fd)
                    except OSError:
                        pass
            logger.error("could not append a record to the journal %s: %s", self.base_path, exc)
            return None
        segment.num_bytes += len(payload)
        self._dirty.add(segment.fd)
        if not self._written.is_set():
            self._written.set()
        return segment

    def _current(self) -> _Segment | None:
        if self._segments and self._segments[-1].num_bytes < self.segment_bytes:
            return self._segments[-1]
        path = self.base_path.with_name(f"{self._pattern()}{self._next_index}")
        while path.exists():
            self._next_index += 1
            path = self.base_path.with_name(f"{self._pattern()}{self._next_index}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            logger.error("could not open a journal segment %s: %s", path, exc)
            return None
        self._next_index += 1
        segment = _Segment(path, fd)
        self._segments.append(segment)
        return segment

    # -- background -------------------------------------------------------------------------------------------

    def dirty_descriptors(self) -> list[int]:
        """Duplicates of the descriptors written since the last call, for `sync_descriptors` in a worker thread."""
        fds = [os.dup(fd) for fd in self._dirty]
        self._dirty.clear()
        return fds

    @staticmethod
    def sync_descriptors(fds: list[int]) -> None:
        """fsync and close the given (duplicated) descriptors."""
        try:
            for fd in fds:
                os.fsync(fd)
        finally:
            for fd in fds:
                os.close(fd)

    def resolved(self, num_records: int) -> None:
        """The oldest `num_records` journaled records have a home now; delete segments that hold only such (a segment
        holding a record still held by a sink stays, and so do the ones after it)."""
        self._resolved += num_records
        while self._segments and self._segments[0].num_records <= self._resolved and not self._segments[0].pins:
            segment = self._segments[0]
            if segment is self._segments[-1] and segment.num_bytes < self.segment_bytes:
                if segment.num_records == self._resolved and segment.num_bytes:
                    os.ftruncate(segment.fd, 0)  # everything in it is home: start it over
                    segment.num_bytes = segment.num_records = self._resolved = 0
                return
            self._segments.popleft()
            self._resolved -= segment.num_records
            self._dirty.discard(segment.fd)
            os.close(segment.fd)
            segment.path.unlink(missing_ok=True)

    def close(self, remove: bool) -> None:
        """Close every segment; `remove` deletes them (every record in them has a home)."""
        while self._segments:
            segment = self._segments.popleft()
            os.close(segment.fd)
            if remove:
                segment.path.unlink(missing_ok=True)
        self._dirty.clear()

    # -- used by the writer -----------------------------------------------------------------------------------

    def recover_into(self, spill: SpillFile) -> bool:
        """Move what a previous process left in the journal into the spill file, to be replayed (blocking I/O).

        Of the lines with one request id only the last is moved (a record journaled while a sink held it, then
        completed). Returns whether everything was moved. A segment that cannot be moved now (a full disk) stays
        where it is, whole, and so do the segments after it; call again later."""
        paths = self.leftover_paths()
        try:
            superseded = _superseded_lines(paths)
        except OSError as exc:
            logger.error("could not read the journal segments beside %s: %s", spill.path, exc)
            return False
        for path in paths:
            try:
                lines = [line for index, line in enumerate(self.read_lines(path)) if (path, index) not in superseded]
                spill.append_lines(lines)
            except OSError as exc:
                logger.error(
                    "could not move the journaled records of %s into the spill file %s (%s); they stay in the "
                    "journal and are moved once it can take them",
                    path,
                    spill.path,
                    exc,
                )
                return False
            path.unlink(missing_ok=True)  # should this fail, the next move repeats lines: replay skips duplicates
            if lines:
                logger.warning("recovered %d journaled records from %s into the spill file", len(lines), path)
        return True

    async def sync_forever(self, interval_s: float) -> None:
        """fsync what was appended, at most `interval_s` seconds after it was, until cancelled."""
        while True:
            await self._written.wait()
            await asyncio.sleep(interval_s)
            self._written.clear()
            fds = self.dirty_descriptors()
            if fds:
                try:
                    await asyncio.to_thread(self.sync_descriptors, fds)
                except OSError:
                    logger.exception("could not fsync the journal %s", self.base_path)


class _RequestId(msgspec.Struct):
    request_id: str


_ID_DECODER = msgspec.json.Decoder(_RequestId)


def _superseded_lines(paths: list[Path]) -> set[tuple[Path, int]]:
    """(segment, line index) of every line followed by a later line with the same request id, in `paths` order.
    Lines that do not parse are kept (the replay sets them aside as rejected)."""
    last: dict[str, tuple[Path, int]] = {}
    superseded: set[tuple[Path, int]] = set()
    for path in paths:
        for index, line in enumerate(Journal.read_lines(path)):
            try:
                request_id = _ID_DECODER.decode(line).request_id
            except msgspec.DecodeError:
                continue
            earlier = last.get(request_id)
            if earlier is not None:
                superseded.add(earlier)
            last[request_id] = (path, index)
    return superseded
