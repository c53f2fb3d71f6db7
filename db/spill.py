"""The writer's spill file: request records kept on local disk while the database cannot take them.

JSON Lines, one `RequestRecord.to_json()` per line, appended and fsynced per batch. An append is whole or absent:
when a write or the fsync fails (a full disk), the file is cut back to its length before the append, and if even
that fails the torn tail is found and cut before the next append, so a later record is never glued to a broken line.
Replay reads from a byte offset in chunks and only advances past a chunk once it is committed; when everything has
been replayed the file is truncated. A crash mid-replay leaves already-stored lines in the file, which is harmless:
storing is idempotent by request id. Lines that cannot be parsed (a torn write at a crash of an earlier process) go
to a `.rejected` file next to it, counted.

The methods block on file I/O; the async writer calls them through `asyncio.to_thread`. One writer owns a file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from db.records import RequestRecord

logger = logging.getLogger("prefixscope.db.spill")

_TAIL_SCAN_BYTES = 1 << 16


def write_all(fd: int, payload: bytes, write: Callable[[int, bytes], int] = os.write) -> None:
    """Write every byte of `payload` to `fd` (a short write is continued; an error raises OSError)."""
    view = memoryview(payload)
    while view:
        written = write(fd, view)
        if written <= 0:
            raise OSError("write made no progress")
        view = view[written:]


def cut_torn_tail(fd: int) -> int:
    """Cut bytes after the last newline of the file open at `fd`; returns how many were cut."""
    size = os.fstat(fd).st_size
    end = size
    while end > 0:
        start = max(0, end - _TAIL_SCAN_BYTES)
        block = os.pread(fd, end - start, start)
        if start + len(block) == size and block.endswith(b"\n"):
            return 0
        newline = block.rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            os.ftruncate(fd, keep)
            return size - keep
        end = start
    if size:
        os.ftruncate(fd, 0)
    return size


@dataclass(frozen=True)
class SpillChunk:
    """Records read from the spill file, the lines that did not parse, and where the next chunk starts."""

    records: list[RequestRecord]
    bad_lines: list[str]
    end_offset: int

    @property
    def num_lines(self) -> int:
        return len(self.records) + len(self.bad_lines)


class SpillFile:
    """A JSON Lines file of records waiting to be replayed into the database."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rejected_path = path.with_name(path.name + ".rejected")
        self._offset = 0
        self._tail_may_be_torn = False
        self.torn_tails_cut = 0
        # The write function; tests replace it to make a write fail part-way (a disk that fills up).
        self.write: Callable[[int, bytes], int] = os.write
        self._pending = self._recover()

    @property
    def pending(self) -> int:
        """Records (lines) in the file not yet replayed."""
        return self._pending

    def _recover(self) -> int:
        """Count the lines a previous process left, and end a torn last line so appends start on a fresh one."""
        if not self.path.exists():
            return 0
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
                try:
                    write_all(fd, b"\n")
                finally:
                    os.close(fd)
                data += b"\n"
            except OSError as exc:
                # Not even one byte fits (a full disk): leave the torn line out of replay; the next append cuts it.
                self._tail_may_be_torn = True
                data = data[: data.rfind(b"\n") + 1]
                logger.error("could not end the torn last line of the spill file %s (%s); it is cut before the next "
                             "append", self.path, exc)
        return sum(1 for line in data.splitlines() if line.strip())

    def append(self, records: Sequence[RequestRecord]) -> None:
        """Append records and fsync, so that a spilled record survives a crash of the process.

        All or nothing: raises OSError (ENOSPC, EIO, ...) after cutting the file back to where it was, and then
        none of `records` is in the file.
        """
        if not records:
            return
        self.append_lines([record.to_json() for record in records])

    def append_lines(self, lines: Sequence[str]) -> None:
        """`append` for lines that are already `RequestRecord.to_json()` text."""
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = "".join(line + "\n" for line in lines).encode("utf-8")
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if self._tail_may_be_torn:
                cut = cut_torn_tail(fd)
                self._tail_may_be_torn = False
                if cut:
                    self.torn_tails_cut += 1
                    logger.error("cut a torn tail of %d bytes from the spill file %s", cut, self.path)
            start = os.fstat(fd).st_size
            try:
                write_all(fd, payload, self.write)
                os.fsync(fd)
            except OSError:
                try:
                    os.ftruncate(fd, start)
                except OSError:
                    self._tail_may_be_torn = True
                raise
        finally:
            os.close(fd)
        self._pending += len(lines)

    def read_chunk(self, max_records: int) -> SpillChunk:
        """Up to `max_records` lines from the current offset (nothing is consumed until `advance`)."""
        records: list[RequestRecord] = []
        bad_lines: list[str] = []
        if not self.path.exists():
            return SpillChunk(records, bad_lines, self._offset)
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            while len(records) + len(bad_lines) < max_records:
                raw = handle.readline()
                if not raw or (self._tail_may_be_torn and not raw.endswith(b"\n")):
                    break  # the end, or a torn tail the next append cuts
                text = raw.decode("utf-8", errors="replace").strip()
                if not text:
                    continue
                try:
                    records.append(RequestRecord.from_json(text))
                except (ValueError, TypeError, KeyError):
                    bad_lines.append(text)
            end_offset = handle.tell()
        return SpillChunk(records, bad_lines, end_offset)

    def advance(self, chunk: SpillChunk) -> None:
        """Mark a chunk as stored; truncate the file once everything in it has been replayed."""
        self._offset = chunk.end_offset
        self._pending = max(0, self._pending - chunk.num_lines)
        size = self.path.stat().st_size if self.path.exists() else 0
        # At the end (or the file was removed or cut short behind our back): nothing is pending any more.
        if self._offset >= size:
            if size:
                with self.path.open("wb"):
                    pass
            self._offset = 0
            self._pending = 0

    def reject(self, lines: Sequence[str]) -> None:
        """Keep lines the database will never accept in the `.rejected` file, for an operator to look at."""
        if not lines:
            return
        self.rejected_path.parent.mkdir(parents=True, exist_ok=True)
        # Owner-only like the spill file: these are the same records (prompt text included when it is stored).
        fd = os.open(self.rejected_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)  # a file left readable by an earlier version is closed too
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.writelines(line + "\n" for line in lines)
            handle.flush()
            os.fsync(handle.fileno())
