"""The L3 file format, version 2: checksummed token chunks, so part of a file is read and verified on its own; files
of the older format are skipped at start-up (warned, counted)."""

from __future__ import annotations

import json
import logging
import struct

import pytest
import torch

from local_engine.cache.tiers.disk_index import DiskTier
from local_engine.cache.tiers.disk_store import (
    file_name,
    CHUNK_TOKENS,
    CorruptKVFile,
    read_header,
    read_kv_file,
    read_kv_range,
    write_kv_file,
)

from .tier_fixtures import LAYOUT

NUM_TOKENS = 2 * CHUNK_TOKENS + 22  # two full chunks and a short one
FIELDS = {"namespace": "ns", "token_ids": list(range(NUM_TOKENS)), "edge_start": 0, "retention": "5m",
          "ttl_s": 300.0, "persistent": False}


def _kv() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shape = (LAYOUT.num_layers, NUM_TOKENS, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def _flip_byte_of_token(path, token: int) -> None:
    _, offset = read_header(str(path))
    raw = bytearray(path.read_bytes())
    raw[offset + token * LAYOUT.payload_bytes(1) + 3] ^= 0x5A
    path.write_bytes(bytes(raw))


def test_any_token_range_reads_back_exactly(tmp_path):
    k, v = _kv()
    path = tmp_path / "a.kv"
    write_kv_file(str(path), LAYOUT, FIELDS, k, v)
    header, _ = read_header(str(path))
    assert header["version"] == 2 and len(header["chunk_checksums"]) == 3
    for start, length in [(0, NUM_TOKENS), (0, 1), (CHUNK_TOKENS - 2, 5), (CHUNK_TOKENS, CHUNK_TOKENS),
                          (NUM_TOKENS - 3, 3)]:
        got_k, got_v = read_kv_range(str(path), LAYOUT, start, length)
        assert torch.equal(got_k, k[:, start : start + length]) and torch.equal(got_v, v[:, start : start + length])
    with pytest.raises(CorruptKVFile):
        read_kv_range(str(path), LAYOUT, NUM_TOKENS - 1, 2)


def test_a_corrupt_chunk_fails_the_ranges_that_read_it_and_only_those(tmp_path):
    k, v = _kv()
    path = tmp_path / "a.kv"
    write_kv_file(str(path), LAYOUT, FIELDS, k, v)
    _flip_byte_of_token(path, CHUNK_TOKENS + 5)  # inside the second chunk
    got_k, _ = read_kv_range(str(path), LAYOUT, 0, 10)  # the first chunk is intact: served
    assert torch.equal(got_k, k[:, :10])
    got_k, _ = read_kv_range(str(path), LAYOUT, 2 * CHUNK_TOKENS, 22)
    assert torch.equal(got_k, k[:, 2 * CHUNK_TOKENS :])
    for start, length in [(CHUNK_TOKENS + 5, 1), (CHUNK_TOKENS - 1, 2), (0, NUM_TOKENS)]:
        with pytest.raises(CorruptKVFile, match="checksum"):
            read_kv_range(str(path), LAYOUT, start, length)
    with pytest.raises(CorruptKVFile):
        read_kv_file(str(path), LAYOUT)


def test_version_1_files_are_skipped_at_start_up_and_counted(tmp_path, caplog):
    k, v = _kv()
    directory = tmp_path / "kv"
    directory.mkdir()
    current = directory / file_name(LAYOUT, FIELDS["namespace"], FIELDS["token_ids"], FIELDS["edge_start"])
    write_kv_file(str(current), LAYOUT, FIELDS, k, v)
    # A version 1 file: one checksum over K then V, no chunk table.
    payload = k.numpy().tobytes() + v.numpy().tobytes()
    header = {"version": 1, "model": LAYOUT.model_fingerprint, "dtype": "float32", "page_size": 1,
              "num_layers": LAYOUT.num_layers, "num_kv_heads": LAYOUT.num_kv_heads, "head_dim": LAYOUT.head_dim,
              **FIELDS, "token_ids": list(range(1000, 1000 + NUM_TOKENS)), "num_tokens": NUM_TOKENS,
              "payload_bytes": len(payload), "checksum": "0" * 32}
    raw = json.dumps(header).encode()
    (directory / "old.kv").write_bytes(struct.pack("<4sI", b"PSKV", len(raw)) + raw + payload)
    tier = DiskTier(str(directory), LAYOUT, 10 * NUM_TOKENS * LAYOUT.payload_bytes(1))
    tier.open()
    try:
        with caplog.at_level(logging.WARNING):
            found = tier.scan()
    finally:
        tier.close()
    assert [indexed.file.name for indexed in found] == [current.name]
    assert tier.corrupt_files_total == 1
    assert any("old.kv" in record.getMessage() and "version" in record.getMessage() for record in caplog.records)
