"""Storage for "explain every miss" and the what-if simulator: miss reasons, divergence locations, normalization
gains and hash chains, written with their rollups and read back; figures worked out by hand."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import func, select

from db import queries
from db.chains import RequestChain, pack_hash_ids, unpack_hash_ids
from db.engine import create_sync_engine_for
from db.models import HourlyDivergence, HourlyMissReason, HourlyPrefixRollup, HourlyRollup, table_of
from db.records import RequestRecord
from db.store import CHAINS, prune_requests, store_records

MakeRecord = Callable[..., RequestRecord]
T0 = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
CHAIN = RequestChain(block_size=16, input_length=50, hash_ids=(1, -2, 2**63 - 1), approximate=True)


def test_hash_ids_pack_little_endian_int64() -> None:
    packed = pack_hash_ids([1, -1, 2**63 - 1])
    assert packed[:8] == b"\x01" + b"\x00" * 7
    assert packed[8:16] == b"\xff" * 8
    assert len(packed) == 24 and unpack_hash_ids(packed) == (1, -1, 2**63 - 1)
    assert CHAIN.packed_hash_ids() == pack_hash_ids(CHAIN.hash_ids) and CHAIN.num_blocks == 3
    with pytest.raises(ValueError):
        unpack_hash_ids(b"\x00" * 9)


def test_chain_validation_and_coercion() -> None:
    assert RequestChain(16, 32, [5, 6]).hash_ids == (5, 6)  # type: ignore[arg-type]
    for bad in (
        {"block_size": 0, "input_length": 1, "hash_ids": ()},
        {"block_size": 16, "input_length": -1, "hash_ids": ()},
        {"block_size": 16, "input_length": 16, "hash_ids": (2**63,)},
    ):
        with pytest.raises(ValueError):
            RequestChain(**bad)


def test_record_with_chain_round_trips_through_json(make_record: MakeRecord) -> None:
    item = make_record(miss_reason="tools_changed", divergence_segment="tools", chain=CHAIN)
    data = json.loads(item.to_json())
    assert data["chain"] == {"block_size": 16, "input_length": 50, "hash_ids": [1, -2, 2**63 - 1], "approximate": True}
    assert RequestRecord.from_json(item.to_json()) == item
    # A spill line written before these fields existed still reads, with them unset.
    old = {key: value for key, value in data.items() if key not in {"chain", "miss_reason", "divergence_segment"}}
    restored = RequestRecord.from_json(json.dumps(old))
    assert restored.chain is None and restored.miss_reason is None


def _dataset(make_record: MakeRecord) -> list[RequestRecord]:
    acme: dict[str, Any] = {"tenant": "acme", "prefix_hash": "p1"}
    return [
        make_record(**acme, created_at=T0, prompt_tokens=1000, cached_tokens=992, miss_reason="hit",
                    recomputed_tokens=0, normalization_gain_tokens=0, chain=CHAIN),
        make_record(**acme, created_at=T0 + timedelta(minutes=10), prompt_tokens=1000, cached_tokens=400,
                    miss_reason="tools_changed", divergence_segment="tools", divergence_char_offset=130,
                    recomputed_tokens=592, normalization_gain_tokens=592),
        make_record(**acme, created_at=T0 + timedelta(minutes=20), prompt_tokens=800, cached_tokens=0,
                    miss_reason="volatile_value", divergence_segment="system", divergence_char_offset=41,
                    recomputed_tokens=700),
        make_record(tenant="acme", created_at=T0 + timedelta(minutes=30), prompt_tokens=600, cached_tokens=0,
                    miss_reason="tools_changed", divergence_segment="tools", divergence_char_offset=190,
                    recomputed_tokens=300, prefix_hash="p2"),
        make_record(tenant="globex", created_at=T0 + timedelta(minutes=70), prompt_tokens=300, cached_tokens=0,
                    miss_reason="new_prefix", prefix_hash="p1",
                    chain=RequestChain(16, 300, tuple(range(18)))),
        # A segment without an offset counts as a reason but not as a divergence location.
        make_record(tenant="globex", created_at=T0 + timedelta(minutes=75), miss_reason="messages_changed",
                    divergence_segment="messages[2]", recomputed_tokens=None),
    ]  # fmt: skip


def _rows(conn: Any, model: Any, *columns: str) -> list[tuple[Any, ...]]:
    table = table_of(model)
    return sorted(tuple(row) for row in conn.execute(select(*(table.c[name] for name in columns))))


def test_writer_stores_reasons_chains_and_their_rollups(
    db_url: str, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    records = _dataset(make_record)
    engine = create_sync_engine_for(db_url)
    try:
        with engine.begin() as conn:
            assert store_records(conn, records).inserted == 6
        with engine.connect() as conn:
            stored = {item.request_id: queries.request_detail(conn, item.request_id) for item in records}
            assert stored == {item.request_id: item for item in records}  # every field, the chain included
            assert _rows(conn, HourlyMissReason, "bucket_start", "tenant", "miss_reason", "requests",
                         "recomputed_tokens") == [
                (T0, "acme", "hit", 1, 0),
                (T0, "acme", "tools_changed", 2, 892),
                (T0, "acme", "volatile_value", 1, 700),
                (T0 + timedelta(hours=1), "globex", "messages_changed", 1, 0),
                (T0 + timedelta(hours=1), "globex", "new_prefix", 1, 0),
            ]  # fmt: skip
            assert _rows(conn, HourlyDivergence, "tenant", "segment", "offset_bucket", "requests",
                         "recomputed_tokens") == [
                ("acme", "system", 0, 1, 700),
                ("acme", "tools", 128, 2, 892),
            ]  # fmt: skip
            assert _rows(conn, HourlyPrefixRollup, "bucket_start", "tenant", "prefix_hash", "requests",
                         "requests_with_hit", "prompt_tokens", "cached_tokens", "first_seen", "last_seen") == [
                (T0, "acme", "p1", 3, 2, 2800, 1392, T0, T0 + timedelta(minutes=20)),
                (T0, "acme", "p2", 1, 0, 600, 0, T0 + timedelta(minutes=30), T0 + timedelta(minutes=30)),
                (T0 + timedelta(hours=1), "globex", "p1", 1, 0, 300, 0, T0 + timedelta(minutes=70),
                 T0 + timedelta(minutes=70)),
            ]  # fmt: skip
            assert _rows(conn, HourlyRollup, "tenant", "normalization_sampled_requests",
                         "normalization_requests_with_gain", "normalization_gain_tokens",
                         "normalization_prompt_tokens") == [
                ("acme", 2, 1, 592, 2000),
                ("globex", 0, 0, 0, 0),
            ]  # fmt: skip
        before = db_helpers.rollup_snapshot(db_url)
        # Replaying the same records (and one twice within a batch) adds nothing: no rows, chains or sums.
        with engine.begin() as conn:
            result = store_records(conn, [*records, records[0]])
        assert (result.inserted, result.duplicates) == (0, 7)
        assert db_helpers.rollup_snapshot(db_url) == before
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(CHAINS)).scalar() == 2
        db_helpers.assert_rollups_match_requests(db_url)
    finally:
        engine.dispose()


def test_a_later_batch_adds_onto_prefix_first_and_last_seen(db_url: str, make_record: MakeRecord) -> None:
    engine = create_sync_engine_for(db_url)
    try:
        for minutes in (30, 5, 50):
            with engine.begin() as conn:
                store_records(conn, [make_record(prefix_hash="p", created_at=T0 + timedelta(minutes=minutes))])
        with engine.connect() as conn:
            assert _rows(conn, HourlyPrefixRollup, "requests", "first_seen", "last_seen") == [
                (3, T0 + timedelta(minutes=5), T0 + timedelta(minutes=50))
            ]
    finally:
        engine.dispose()


def test_prune_deletes_chains_with_their_requests(db_url: str, make_record: MakeRecord) -> None:
    old = make_record(created_at=T0, chain=CHAIN, request_id=str(uuid.uuid4()))
    new = make_record(created_at=T0 + timedelta(days=2), chain=CHAIN)
    engine = create_sync_engine_for(db_url)
    try:
        with engine.begin() as conn:
            store_records(conn, [old, new])
        with engine.begin() as conn:
            assert prune_requests(conn, T0 + timedelta(days=1)) == 1
        with engine.connect() as conn:
            assert list(conn.scalars(select(CHAINS.c.request_id))) == [new.request_id]
            assert queries.request_detail(conn, new.request_id) == new
    finally:
        engine.dispose()


def test_overlong_labels_are_cut_to_their_columns_not_refused(
    db_url: str, make_record: MakeRecord, db_helpers: SimpleNamespace
) -> None:
    item = make_record(miss_reason="r" * 50, divergence_segment="s" * 150, divergence_char_offset=3)
    engine = create_sync_engine_for(db_url)
    try:
        with engine.begin() as conn:
            assert store_records(conn, [item]).inserted == 1
        with engine.connect() as conn:
            stored = queries.request_detail(conn, item.request_id)
            assert stored is not None
            assert (stored.miss_reason, stored.divergence_segment) == ("r" * 32, "s" * 100)
            assert _rows(conn, HourlyMissReason, "miss_reason") == [("r" * 32,)]
            assert _rows(conn, HourlyDivergence, "segment") == [("s" * 100,)]
        db_helpers.assert_rollups_match_requests(db_url)
    finally:
        engine.dispose()
