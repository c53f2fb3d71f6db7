"""The request record is declared once (`db.records.RequestRecord` with `db.record_schema` metadata): the ORM's
`requests` columns, the stored row, the explorer's `RequestRow` and the rollup sums agree with it field by field.

That the migrated `requests` table matches the ORM is `tests/db/test_migrations.py::
test_migrated_schema_matches_the_models` (Alembic's autogenerate compare, SQLite and PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Boolean, Float, Integer, SmallInteger, String, Text

from db import queries
from db.chains import RequestChain
from db.engine import create_sync_engine_for
from db.ledger import LOST_CAUSES, lost_field
from db.models import HourlyRollup, RequestRecordRow, table_of
from db.queries.results import RequestRow
from db.record_schema import listed_fields, listed_row, stored, stored_fields
from db.records import RequestRecord
from db.rollups import PLAIN_SUMS, ROLLUP_SUM_COLUMNS
from db.store import record_to_row, row_to_record, store_records
from db.types import UTCDateTime

REQUESTS = table_of(RequestRecordRow)
# Record fields kept in other tables than `requests`: the hash chain, the rule advice, the prompt signature and the
# namespace label.
ELSEWHERE = {"chain", "advice", "signature", "namespace_label"}
SQL_TYPES = {
    "string": String,
    "text": Text,
    "int": Integer,
    "smallint": SmallInteger,
    "float": Float,
    "bool": Boolean,
    "datetime": UTCDateTime,
}


def test_every_record_field_is_a_column_or_kept_elsewhere_by_name() -> None:
    stored_names = {item.name for item in stored_fields(RequestRecord)}
    assert {item.name for item in fields(RequestRecord)} - stored_names == ELSEWHERE


def test_the_orm_has_one_column_per_stored_field_with_its_type_width_and_nullability() -> None:
    columns = {column.name: column for column in REQUESTS.c}
    assert list(columns) == [item.column for item in stored_fields(RequestRecord)]
    for item in stored_fields(RequestRecord):
        column = columns[item.column]
        assert column.nullable == item.nullable, item.name
        if item.stored.kind == "json":
            assert column.default is not None and not column.nullable
            continue
        assert isinstance(column.type, SQL_TYPES[item.stored.kind]), item.name
        assert getattr(column.type, "length", None) == item.stored.max_chars, item.name
    assert [column.name for column in REQUESTS.primary_key] == ["id"]


def test_the_read_row_has_the_listed_fields_with_the_record_s_types_and_defaults() -> None:
    record_fields = {item.name: item for item in fields(RequestRecord)}
    row_fields = fields(RequestRow)
    assert [item.name for item in row_fields] == [item.name for item in listed_fields(RequestRecord)]
    assert {"prompt_text", "hash_key_version"} & {item.name for item in row_fields} == set()
    for item in row_fields:
        declared = record_fields[item.name]
        assert item.type == declared.type, item.name
        assert item.default == declared.default, item.name


def test_nullable_fields_say_what_null_means_and_units_are_declared_for_counts() -> None:
    for item in stored_fields(RequestRecord):
        assert (item.stored.null is not None) == item.nullable, item.name
        if item.name.endswith("_tokens"):
            assert item.stored.unit == "tokens", item.name
        if item.name.endswith("_ms"):
            assert item.stored.unit == "ms", item.name


def test_plain_rollup_sums_name_columns_of_hourly_rollups() -> None:
    rollup_columns = {column.name for column in table_of(HourlyRollup).c}
    assert PLAIN_SUMS and {column for _, column in PLAIN_SUMS} <= set(ROLLUP_SUM_COLUMNS) <= rollup_columns
    assert ("latency_ms", "latency_ms_sum") in PLAIN_SUMS


def _full_record(make_record: Callable[..., RequestRecord]) -> RequestRecord:
    """A record with every stored field set to a value other than its default."""
    return make_record(
        key_id="k1",
        error_type=None,
        applied_rules=("newlines", "tool_order"),
        miss_kind="partial",
        prefix_hash="ab" * 8,
        prompt_text="hello",
        diverged_at_token=12,
        miss_reason="system_changed",
        divergence_segment="system",
        divergence_char_offset=40,
        recomputed_tokens=88,
        normalization_gain_tokens=16,
        ttft_source="engine",
        divergence_source="engine",
        template_tokens=3,
        hash_key_version=1,
        cache_write_tokens=5,
        retention_class="1h",
        replica="http://127.0.0.1:8002",
        routing_policy="cache_aware",
        predicted_match_tokens=32,
        routing_index_source="precise",
        cached_tokens=12,
        cached_tokens_device=8,
        cached_tokens_host=4,
        cached_tokens_disk=0,
        cache_load_ms=1.5,
        provider_miss_reason="tools_changed",
        provider_missed_tokens=1536,
        conversation_id="c" * 32,
        conversation_source="content",
        turn_index=2,
        parent_request_id="p1",
        idle_s=4.5,
        answer_rewrite="whitespace",
        answer_rewrite_segment="messages[2]",
        answer_rewrite_char_offset=25,
        new_tokens=20,
        unknown_tokens=0,
        evicted_tier="host",
        **{lost_field(cause): index + 1 for index, cause in enumerate(LOST_CAUSES)},
    )


def test_record_to_row_and_back_keeps_every_stored_field(make_record: Callable[..., RequestRecord]) -> None:
    record = _full_record(make_record)
    for item in stored_fields(RequestRecord):
        if item.name != "error_type":
            assert getattr(record, item.name) != item.default, f"the test record leaves {item.name} at its default"
    row = record_to_row(record)
    assert set(row) == {column.name for column in REQUESTS.c}
    assert row_to_record(_Row(row)) == record


def test_a_row_without_newer_columns_reads_with_the_field_defaults(make_record: Callable[..., RequestRecord]) -> None:
    row = record_to_row(make_record())
    for name in ("replica", "routing_index_source", "cache_load_ms", "hash_key_version"):
        del row[name]
    assert row_to_record(_Row(row)) == make_record(request_id=row["id"])


def test_a_stored_record_reads_back_the_same_in_detail_and_in_the_list(
    db_url: str, make_record: Callable[..., RequestRecord]
) -> None:
    record = replace(
        _full_record(make_record),
        chain=RequestChain(block_size=16, input_length=40, hash_ids=(1, 2, 3), approximate=True),
        namespace_label="ns-acme",
        advice=(),
    )
    plain = make_record(created_at=record.created_at - timedelta(minutes=1))
    engine = create_sync_engine_for(db_url)
    try:
        with engine.begin() as conn:
            store_records(conn, [record, plain])
        with engine.connect() as conn:
            detail = queries.request_detail(conn, record.request_id)
            listed = {row.request_id: row for row in queries.recent_requests(conn, limit=10)}
    finally:
        engine.dispose()
    assert detail is not None
    assert replace(detail, namespace_label=record.namespace_label) == record
    for stored_record in (record, plain):
        row = listed[stored_record.request_id]
        for item in listed_fields(RequestRecord):
            assert getattr(row, item.name) == getattr(stored_record, item.name), item.name
    assert listed[record.request_id].cache_hit is record.cache_hit


def test_a_nullable_field_without_a_null_meaning_is_refused() -> None:
    @dataclass(frozen=True)
    class Careless:
        tokens: int | None = field(default=None, metadata=stored("int", unit="tokens"))

    with pytest.raises(TypeError, match="NULL"):
        stored_fields(Careless)


def test_a_read_row_cannot_declare_fields_of_its_own() -> None:
    with pytest.raises(TypeError, match="declare them there"):

        @listed_row(RequestRecord)
        class Extra:
            extra: int


class _Row:
    """A result row: attribute access by column name."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)
