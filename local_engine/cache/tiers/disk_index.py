"""The L3 directory: an exclusive lock, the files this engine may serve, their reference counts and capacity.

A node's disk copy is a `DiskExtent`: a token range of one file. A node split later makes two extents of the same
file; a file is deleted when no extent references it. Capacity is counted in tokens referenced by extents
(`capacity_tokens = capacity_bytes // payload bytes per token`); header bytes are not counted.

Two engines never share a directory: `open` takes an exclusive, non-blocking `fcntl.flock` on `.lock` inside it and
raises DiskCacheLocked naming the directory when another process holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from dataclasses import dataclass, field

import torch

from local_engine.cache.tiers.disk_store import (
    FILE_SUFFIX,
    CorruptKVFile,
    KVLayout,
    file_name,
    read_header,
    read_kv_file,
    read_kv_range,
    write_kv_file,
)

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"


class DiskCacheLocked(RuntimeError):
    """Another engine holds the disk cache directory."""


@dataclass
class DiskFile:
    name: str
    num_tokens: int
    refs: int = 0
    ttl_s: float | None = None  # the lifetime its header records (see local_engine.cache.retention)
    persistent: bool = False


@dataclass(frozen=True)
class DiskExtent:
    """Tokens `[start, start + num_tokens)` of `file`'s payload (token offsets within the file)."""

    file: DiskFile
    start: int
    num_tokens: int

    def split(self, num_tokens: int) -> tuple[DiskExtent, DiskExtent]:
        """The first `num_tokens` and the rest, each referencing the file (the caller adds one reference)."""
        upper = DiskExtent(self.file, self.start, num_tokens)
        lower = DiskExtent(self.file, self.start + num_tokens, self.num_tokens - num_tokens)
        return upper, lower


@dataclass(frozen=True)
class IndexedFile:
    """A usable file found at start-up (header only read), to rebuild its node from."""

    file: DiskFile
    namespace: str
    token_ids: list[int]
    edge_start: int
    mtime_s: float  # wall-clock modification time
    ttl_s: float | None
    persistent: bool


@dataclass
class DiskTier:
    directory: str
    layout: KVLayout
    capacity_bytes: int
    files: dict[str, DiskFile] = field(default_factory=dict)
    used_tokens: int = 0  # tokens referenced by extents
    corrupt_files_total: int = 0
    _lock_fd: int | None = None

    @property
    def bytes_per_token(self) -> int:
        return self.layout.payload_bytes(1)

    @property
    def capacity_tokens(self) -> int:
        return self.capacity_bytes // self.bytes_per_token

    @property
    def free_tokens(self) -> int:
        return max(0, self.capacity_tokens - self.used_tokens)

    # ---- lifecycle --------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Create the directory (mode 0700) and take its lock, or adopt the lock `reserve_directory` took for it in
        this process. Raises DiskCacheLocked when another engine has it, OSError when it cannot be created or
        locked. An existing directory keeps its mode: it may be shared."""
        reserved = _RESERVED.pop(os.path.realpath(self.directory), None)
        self._lock_fd = reserved if reserved is not None else _create_and_lock(self.directory)

    def close(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def scan(self) -> list[IndexedFile]:
        """Every usable file in the directory, headers only; skips (with a warning, counted in
        `corrupt_files_total`) corrupt headers, truncated files and files of another model, dtype or page size."""
        found = []
        for entry in sorted(os.scandir(self.directory), key=lambda e: e.name):
            if entry.name.startswith(".tmp-") and entry.name.endswith(FILE_SUFFIX):
                # A write that never reached its rename (a crash): nobody else writes here while we hold the lock.
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                continue
            if not entry.name.endswith(FILE_SUFFIX) or entry.name.startswith("."):
                continue
            try:
                header, _ = read_header(entry.path)
                problem = self.layout.mismatch(header)
                if problem is None and header["payload_bytes"] != self.layout.payload_bytes(header["num_tokens"]):
                    problem = "payload size does not fit its token count"
                if problem is None and not _named_for(entry.name, self.layout, header):
                    # The checksum covers the payload only: a header naming other tokens (or another namespace)
                    # than the ones its name was derived from would serve this KV for a path it was not computed for.
                    problem = "its header does not match its name (token ids or namespace changed)"
                if problem:
                    raise CorruptKVFile(f"{entry.path}: {problem}")
                ttl_s = header.get("ttl_s")
                indexed = IndexedFile(
                    DiskFile(entry.name, header["num_tokens"], 0, None if ttl_s is None else float(ttl_s),
                             bool(header.get("persistent", False))),
                    header["namespace"],
                    header["token_ids"],
                    header["edge_start"],
                    entry.stat().st_mtime,
                    None if ttl_s is None else float(ttl_s),
                    bool(header.get("persistent", False)),
                )
            except (CorruptKVFile, OSError, TypeError, ValueError) as error:
                self.corrupt_files_total += 1
                log.warning("disk KV cache: skipping %s", error)
                continue
            found.append(indexed)
        return found

    # ---- extents ----------------------------------------------------------------------------------------------

    def adopt(self, file: DiskFile) -> DiskExtent:
        """Serve `file` (from `scan`) as one extent."""
        self.files[file.name] = file
        return self.reference(DiskExtent(file, 0, file.num_tokens))

    def reference(self, extent: DiskExtent) -> DiskExtent:
        extent.file.refs += 1
        self.used_tokens += extent.num_tokens
        return extent

    def release(self, extent: DiskExtent) -> None:
        """Drop one extent; deletes the file once nothing references it."""
        self.used_tokens -= extent.num_tokens
        extent.file.refs -= 1
        if extent.file.refs <= 0:
            self.delete(extent.file)

    def delete(self, file: DiskFile) -> None:
        self.files.pop(file.name, None)
        try:
            os.unlink(os.path.join(self.directory, file.name))
        except FileNotFoundError:
            pass

    def write(self, namespace: str, token_ids: list[int], edge_start: int, k: torch.Tensor, v: torch.Tensor,
              retention: dict) -> DiskExtent:
        """Store the KV (`[num_layers, n, heads, head_dim]`) of `token_ids[edge_start:]` as a new file; returns its
        extent (referenced once). `retention`: label, ttl_s, persistent. Raises OSError when the write fails."""
        name = file_name(self.layout, namespace, token_ids, edge_start)
        if name in self.files:  # the same extent is still referenced by another file: never overwrite it
            base, suffix = name.removesuffix(FILE_SUFFIX), 2
            while f"{base}.{suffix}{FILE_SUFFIX}" in self.files:
                suffix += 1
            name = f"{base}.{suffix}{FILE_SUFFIX}"
        fields = {"namespace": namespace, "token_ids": list(token_ids), "edge_start": edge_start, **retention}
        write_kv_file(os.path.join(self.directory, name), self.layout, fields, k, v)
        file = DiskFile(name, len(token_ids) - edge_start, 0, retention["ttl_s"], retention["persistent"])
        self.files[name] = file
        return self.reference(DiskExtent(file, 0, file.num_tokens))

    def rewrite_retention(self, file: DiskFile, retention: dict) -> None:
        """Record a new lifetime (`retention`: label, ttl_s, persistent) in `file`'s header; the payload and the
        modification time stay. Atomic like `write`. Raises CorruptKVFile or OSError (the old file then stays)."""
        path = os.path.join(self.directory, file.name)
        header, _ = read_header(path)
        k, v = read_kv_file(path, self.layout)
        mtime_s = os.stat(path).st_mtime
        fields = {"namespace": header["namespace"], "token_ids": header["token_ids"],
                  "edge_start": header["edge_start"], **retention}
        write_kv_file(path, self.layout, fields, k, v)
        os.utime(path, (mtime_s, mtime_s))
        file.ttl_s, file.persistent = retention["ttl_s"], retention["persistent"]

    def read(self, extent: DiskExtent) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of the extent (`[num_layers, n, heads, head_dim]`, CPU). Raises CorruptKVFile (counted) when the file
        fails its checks or is gone."""
        path = os.path.join(self.directory, extent.file.name)
        try:
            # Only the chunks of the extent's own tokens are read and verified (a split node covers part of a file).
            return read_kv_range(path, self.layout, extent.start, extent.num_tokens,
                                 file_tokens=extent.file.num_tokens)
        except (CorruptKVFile, OSError) as error:
            self.corrupt_files_total += 1
            raise CorruptKVFile(str(error)) from None

    def file_exists(self, file: DiskFile) -> bool:
        return os.path.exists(os.path.join(self.directory, file.name))


def _named_for(name: str, layout: KVLayout, header: dict) -> bool:
    """Whether `name` is the file name `write` gives `header`'s (namespace, token_ids, edge_start): the name itself
    or, for a second file of the same extent, the name with a `.N` suffix before FILE_SUFFIX."""
    expected = file_name(layout, str(header["namespace"]), header["token_ids"], header["edge_start"])
    if name == expected:
        return True
    base, _, suffix = name.removesuffix(FILE_SUFFIX).rpartition(".")
    return suffix.isdigit() and f"{base}{FILE_SUFFIX}" == expected


def _locked(directory: str) -> DiskCacheLocked:
    return DiskCacheLocked(
        f"the disk cache directory {directory} is in use by another engine "
        f"(it holds {os.path.join(directory, LOCK_FILE)}); give each engine its own --disk-cache-dir"
    )


# Locks taken before the model loads, by real path, for DiskTier.open in the same process to adopt.
_RESERVED: dict[str, int] = {}


def reserve_directory(directory: str) -> None:
    """Create `directory` and take its lock now, before the model loads (a minute on a CPU), so that a second engine
    on it, or a path that cannot be a directory, is refused at once; DiskTier.open in this process adopts the lock.
    Raises DiskCacheLocked when another engine holds it, OSError when it cannot be created or locked."""
    key = os.path.realpath(directory)
    if key not in _RESERVED:
        _RESERVED[key] = _create_and_lock(directory)


def _create_and_lock(directory: str) -> int:
    """The directory (created with mode 0700 when missing), locked: returns the lock file's descriptor."""
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)  # makedirs' mode is narrowed by the umask, never widened: make it exact
    fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _locked(directory) from None
    return fd
