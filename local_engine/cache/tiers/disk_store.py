"""The L3 file format: one file per stored radix node extent, written atomically, verified on every read.

Layout of a file (little-endian):

    offset 0   4 bytes   magic b"PSKV"
    offset 4   4 bytes   header length H (uint32)
    offset 8   H bytes   header: UTF-8 JSON object (below)
    offset 8+H P bytes   payload: chunks of `chunk_tokens` consecutive tokens (the last one may be shorter); a
                         chunk of c tokens is its K then its V, each `[num_layers, c, num_kv_heads, head_dim]` in
                         `dtype`, C-contiguous (P = 2 * num_layers * num_tokens * num_kv_heads * head_dim * element
                         size in all)

Header fields: `version` (FORMAT_VERSION), `model` (model fingerprint), `dtype` (e.g. "float32"), `page_size`,
`num_layers`, `num_kv_heads`, `head_dim`, `namespace`, `token_ids` (every token of the path from the root to the end
of the node), `edge_start` (where the node's edge starts in `token_ids`; the file holds the KV of
`token_ids[edge_start:]`), `num_tokens`, `payload_bytes`, `chunk_tokens`, `chunk_checksums` (blake2b-128 hex of
each chunk's bytes, in order), `retention` (the class label), `ttl_s` (idle seconds or null), `persistent` (bool).

Version 2 made the payload token-major in checksummed chunks so that a node covering part of a file (an extent, after
a split) reads and verifies only the chunks of its own tokens, not the whole file. Version 1 files (one checksum over
K-then-V) are skipped at start-up like any file of another format: warned about and counted as corrupt.

Writes go to a temporary file in the same directory, are fsynced, then `os.replace`d onto the final name, so a crash
leaves either the old file, the new one, or a stray temporary (ignored by the index) but never a torn file. A reader
checks the size and the checksums of the chunks it reads before any byte is served; a mismatch raises CorruptKVFile.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from array import array
from dataclasses import dataclass

import torch

FORMAT_VERSION = 2
CHUNK_TOKENS = 64  # per checksum: a short extent reads ~64 tokens of KV, a whole file pays one hash per chunk
MAGIC = b"PSKV"
FILE_SUFFIX = ".kv"
_PREFIX = struct.Struct("<4sI")
MAX_HEADER_BYTES = 64 << 20


class CorruptKVFile(Exception):
    """A KV file whose header, size or checksum is wrong; its content must never be served."""


@dataclass(frozen=True)
class KVLayout:
    """What a file must agree on to be usable by this engine."""

    model_fingerprint: str
    dtype: torch.dtype
    page_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def payload_bytes(self, num_tokens: int) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * num_tokens * self.num_kv_heads * self.head_dim * element

    def mismatch(self, header: dict) -> str | None:
        """Why a file with `header` cannot be used here, or None when it can."""
        expected = {
            "version": FORMAT_VERSION,
            "model": self.model_fingerprint,
            "dtype": self.dtype_name,
            "page_size": self.page_size,
            "num_layers": self.num_layers,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
        }
        for key, value in expected.items():
            if header.get(key) != value:
                return f"{key} is {header.get(key)!r}, this engine needs {value!r}"
        return None


def file_name(layout: KVLayout, namespace: str, token_ids: list[int], edge_start: int) -> str:
    """A stable name from (model fingerprint, namespace, path tokens, edge start): the chained-hash key of the path."""
    digest = hashlib.blake2b(layout.model_fingerprint.encode(), digest_size=16)
    digest.update(hashlib.blake2b(namespace.encode(), digest_size=16).digest())
    digest.update(array("q", token_ids).tobytes())
    return f"{digest.hexdigest()}-{edge_start}{FILE_SUFFIX}"


def write_kv_file(
    path: str, layout: KVLayout, header_fields: dict, k: torch.Tensor, v: torch.Tensor
) -> int:
    """Write `k, v` (`[num_layers, n, num_kv_heads, head_dim]`) atomically to `path`; returns the file size (bytes).

    `header_fields` must hold namespace, token_ids, edge_start, retention, ttl_s, persistent."""
    num_tokens = int(k.shape[1])
    k, v = k.to(layout.dtype), v.to(layout.dtype)
    chunks, checksums = [], []
    for start in range(0, num_tokens, CHUNK_TOKENS):
        end = min(num_tokens, start + CHUNK_TOKENS)
        chunk = _tensor_bytes(k[:, start:end]) + _tensor_bytes(v[:, start:end])
        chunks.append(chunk)
        checksums.append(hashlib.blake2b(chunk, digest_size=16).hexdigest())
    payload_bytes = sum(len(chunk) for chunk in chunks)
    header = {
        "version": FORMAT_VERSION,
        "model": layout.model_fingerprint,
        "dtype": layout.dtype_name,
        "page_size": layout.page_size,
        "num_layers": layout.num_layers,
        "num_kv_heads": layout.num_kv_heads,
        "head_dim": layout.head_dim,
        **header_fields,
        "num_tokens": num_tokens,
        "payload_bytes": payload_bytes,
        "chunk_tokens": CHUNK_TOKENS,
        "chunk_checksums": checksums,
    }
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    directory = os.path.dirname(path)
    fd, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=FILE_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(_PREFIX.pack(MAGIC, len(header_bytes)))
            out.write(header_bytes)
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return _PREFIX.size + len(header_bytes) + payload_bytes


def read_header(path: str) -> tuple[dict, int]:
    """The header of the file at `path` and the payload's offset, reading no payload byte.

    Raises CorruptKVFile on a bad magic, an unreadable header or a size that disagrees with `payload_bytes`
    (a truncated file); OSError when the file cannot be read."""
    with open(path, "rb") as source:
        prefix = source.read(_PREFIX.size)
        if len(prefix) != _PREFIX.size:
            raise CorruptKVFile(f"{path}: shorter than the file prefix")
        magic, header_length = _PREFIX.unpack(prefix)
        if magic != MAGIC or header_length > MAX_HEADER_BYTES:
            raise CorruptKVFile(f"{path}: not a prefixscope KV file")
        raw = source.read(header_length)
        size = os.fstat(source.fileno()).st_size
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not an object")
        token_ids = [int(t) for t in header["token_ids"]]
        edge_start, num_tokens = int(header["edge_start"]), int(header["num_tokens"])
        payload_bytes = int(header["payload_bytes"])
        str(header["namespace"])
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptKVFile(f"{path}: unreadable header ({error})") from None
    if num_tokens <= 0 or edge_start < 0 or edge_start + num_tokens != len(token_ids):
        raise CorruptKVFile(f"{path}: header token counts disagree")
    # Callers use these as numbers: a header that spells one as a string ("6") must not reach them as one.
    header.update(token_ids=token_ids, edge_start=edge_start, num_tokens=num_tokens, payload_bytes=payload_bytes)
    offset = _PREFIX.size + header_length
    if size != offset + payload_bytes:
        raise CorruptKVFile(f"{path}: {size} bytes, header says {offset + payload_bytes} (truncated?)")
    return header, offset


def read_kv_file(path: str, layout: KVLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the whole file (CPU tensors `[num_layers, n, num_kv_heads, head_dim]`); see `read_kv_range`."""
    header, _ = read_header(path)
    return read_kv_range(path, layout, 0, int(header["num_tokens"]))


def read_kv_range(
    path: str, layout: KVLayout, start: int, num_tokens: int, *, file_tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the file's tokens `[start, start + num_tokens)` (CPU tensors `[num_layers, num_tokens,
    num_kv_heads, head_dim]`), reading only the chunks that hold them, after checking the header, the file size and
    those chunks' checksums. `file_tokens`: the token count the caller expects the file to hold.

    Raises CorruptKVFile on any mismatch (a range outside the file included), OSError when the file is gone."""
    header, offset = read_header(path)
    problem = layout.mismatch(header)
    if problem:
        raise CorruptKVFile(f"{path}: {problem}")
    total = header["num_tokens"]
    if header["payload_bytes"] != layout.payload_bytes(total):
        raise CorruptKVFile(f"{path}: payload size does not fit {total} tokens")
    if file_tokens is not None and total != file_tokens:
        raise CorruptKVFile(f"{path}: holds {total} tokens, expected {file_tokens}")
    chunk_tokens, checksums = _chunking(path, header)
    if num_tokens <= 0 or start < 0 or start + num_tokens > total:
        raise CorruptKVFile(f"{path}: tokens [{start}, {start + num_tokens}) are outside its {total}")
    first, last = start // chunk_tokens, (start + num_tokens - 1) // chunk_tokens
    begin, end = first * chunk_tokens, min(total, (last + 1) * chunk_tokens)
    token_bytes = layout.payload_bytes(1)
    buffer = bytearray((end - begin) * token_bytes)
    with open(path, "rb") as source:  # plain reads: the OS page cache keeps hot files in memory
        source.seek(offset + begin * token_bytes)
        got = source.readinto(buffer)  # straight into the buffer the tensors view: no second copy
    if got != len(buffer):
        raise CorruptKVFile(f"{path}: payload truncated")
    keys, values = [], []
    for index in range(first, last + 1):
        lo = index * chunk_tokens
        hi = min(total, lo + chunk_tokens)
        view = memoryview(buffer)[(lo - begin) * token_bytes : (hi - begin) * token_bytes]
        if hashlib.blake2b(view, digest_size=16).hexdigest() != checksums[index]:
            raise CorruptKVFile(f"{path}: checksum mismatch in chunk {index} (tokens {lo}..{hi})")
        shape = (2, layout.num_layers, hi - lo, layout.num_kv_heads, layout.head_dim)
        kv = torch.frombuffer(view, dtype=layout.dtype).view(shape)
        keys.append(kv[0])
        values.append(kv[1])
    k = keys[0] if len(keys) == 1 else torch.cat(keys, dim=1)
    v = values[0] if len(values) == 1 else torch.cat(values, dim=1)
    skip = start - begin
    return k[:, skip : skip + num_tokens], v[:, skip : skip + num_tokens]


def _chunking(path: str, header: dict) -> tuple[int, list[str]]:
    """The header's chunk size and checksums, checked against its token count."""
    try:
        chunk_tokens = int(header["chunk_tokens"])
        checksums = [str(c) for c in header["chunk_checksums"]]
    except (KeyError, TypeError, ValueError) as error:
        raise CorruptKVFile(f"{path}: unreadable chunk table ({error})") from None
    if chunk_tokens <= 0 or len(checksums) != -(-header["num_tokens"] // chunk_tokens):
        raise CorruptKVFile(f"{path}: the chunk table does not fit {header['num_tokens']} tokens")
    return chunk_tokens, checksums


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()
