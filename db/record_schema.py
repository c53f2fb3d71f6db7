"""How each field of a request record is stored: the one declaration every layer derives from.

Each field of `db.records.RequestRecord` is declared once, with its type and default, plus `stored(...)` metadata:
the column kind and width, the unit, what NULL means, whether the explorer lists it, how text from a client is made
storable, and which `hourly_rollups` columns sum it. From those declarations follow:

- the `requests` table's columns (`db.models.REQUESTS`), nullable exactly when the type admits None;
- the record <-> row mapping (`db.store.record_to_row`, `row_to_record`);
- the explorer's read row (`db.queries.results.RequestRow`: the `listed` fields, with the record's defaults);
- the text fields cleaned at the record's edge (`db.storable`) and the plain rollup sums (`db.rollups`).

This module imports nothing from SQLAlchemy (the gateway's request path and CLI import the record), so a column's
kind is a name that `db.models` maps to a SQLAlchemy type.

Adding a recorded field: declare it in `RequestRecord` with `stored(...)` and write its Alembic migration (a
nullable column). `tests/db/test_record_schema.py` proves the record, the ORM, the migrated table and the read row
agree field by field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from typing import Any, Final, TypeVar

# Column kinds, mapped to SQLAlchemy types by `db.models`: `string` (VARCHAR of `max_chars`), `text` (unbounded),
# `int` (32-bit), `smallint`, `float` (double), `bool`, `datetime` (UTC, timezone-aware), `json` (a list of strings).
KINDS: Final = ("string", "text", "int", "smallint", "float", "bool", "datetime", "json")
_METADATA_KEY: Final = "prefixscope.stored"
T = TypeVar("T")


@dataclass(frozen=True)
class Stored:
    """How one record field is stored in `requests` (see the module docstring)."""

    kind: str
    max_chars: int | None = None  # `string` columns: the width
    column: str | None = None  # the column's name when it is not the field's
    unit: str | None = None  # `tokens`, `ms`, `characters`, ...
    null: str | None = None  # what NULL means; None for a field that is never NULL
    listed: bool = True  # read by the explorer's list (`RequestRow`); False: only by `request_detail`
    client_text: bool = False  # text a client can choose: made storable at the record's edge and flagged (`storable`)
    cut: bool = False  # cut to `max_chars` when the row is built (a label the gateway chose, never refused)
    sums: tuple[str, ...] = ()  # `hourly_rollups` columns that add this field up, NULL skipped

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown column kind {self.kind!r}; known: {KINDS}")
        if (self.kind == "string") != (self.max_chars is not None):
            raise ValueError("a string column, and only a string column, has max_chars")


def stored(kind: str, **details: Any) -> dict[str, Stored]:
    """Field metadata: `field(metadata=stored("int", unit="tokens", null="..."))`."""
    return {_METADATA_KEY: Stored(kind, **details)}


@dataclass(frozen=True)
class StoredField:
    """One stored field of the record: its name, column name, metadata, whether it may be None, and its default."""

    name: str
    column: str
    stored: Stored
    nullable: bool
    default: Any = MISSING  # MISSING: the record requires it

    @property
    def required(self) -> bool:
        return self.default is MISSING


@cache
def stored_fields(record_type: type) -> tuple[StoredField, ...]:
    """The fields of a record dataclass that are columns of its table, in declaration order. Fields without
    `stored(...)` metadata (kept in other tables, such as the hash chain) are left out."""
    found = []
    for item in fields(record_type):
        metadata: Mapping[str, Any] = item.metadata
        declared = metadata.get(_METADATA_KEY)
        if declared is None:
            continue
        default = item.default
        if default is MISSING and item.default_factory is not MISSING:
            default = item.default_factory()
        nullable = "None" in str(item.type).replace(" ", "").split("|")
        if nullable != (declared.null is not None):
            raise TypeError(f"{record_type.__name__}.{item.name}: say what NULL means exactly when it may be None")
        found.append(StoredField(item.name, declared.column or item.name, declared, nullable, default))
    return tuple(found)


def listed_fields(record_type: type) -> tuple[StoredField, ...]:
    """The fields the explorer's list reads (`Stored.listed`)."""
    return tuple(item for item in stored_fields(record_type) if item.stored.listed)


def listed_row(record_type: type) -> Callable[[type[T]], type[T]]:
    """Class decorator: a frozen dataclass whose fields are the `listed` fields of `record_type`, with their types
    and defaults; the decorated class adds only behaviour (properties). Raises TypeError when the class declares a
    field of its own."""
    listed = listed_fields(record_type)
    types = {item.name: item.type for item in fields(record_type) if item.name in {f.name for f in listed}}

    def make(cls: type[T]) -> type[T]:
        if cls.__dict__.get("__annotations__"):
            raise TypeError(f"{cls.__name__} takes its fields from {record_type.__name__}; declare them there")
        cls.__annotations__ = dict(types)
        for item in listed:
            if not item.required:
                setattr(cls, item.name, field(default=item.default))
        return dataclass(frozen=True)(cls)

    return make
