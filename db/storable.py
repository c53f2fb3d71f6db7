"""Making a request record storable on every backend before it reaches the database.

A client can put anything in a model name (NUL, a lone UTF-16 surrogate, ten thousand characters); PostgreSQL
refuses NUL in text and values over a column's width, and no backend can encode a lone surrogate. Rather than lose
the record of a request the client saw answered, each text field is cut to its column width, NUL becomes U+FFFD
and unencodable code points become `?`, and the record is flagged with `record_sanitized:<field>` in
`applied_rules` for each field that changed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from db.record_schema import stored_fields
from db.records import RequestRecord

SANITIZED_FLAG: Final = "record_sanitized"
# Field -> column width (None: unbounded text) of the text a client can choose (`db.record_schema.Stored.client_text`).
_TEXT_FIELDS: Final[dict[str, int | None]] = {
    item.name: item.stored.max_chars for item in stored_fields(RequestRecord) if item.stored.client_text
}
_RULE_MAX: Final = 100  # a rule name is a rollup dimension value, String(100)


def storable_text(value: str, max_chars: int | None) -> str:
    """`value` with NUL replaced by U+FFFD, lone surrogates by `?`, cut to `max_chars`."""
    text = value.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text if max_chars is None else text[:max_chars]


def storable_record(record: RequestRecord) -> RequestRecord:
    """The record itself when every field is storable, else a copy with the fields fixed and flagged."""
    changes: dict[str, object] = {}
    for name, width in _TEXT_FIELDS.items():
        value = getattr(record, name)
        if isinstance(value, str):
            fixed = storable_text(value, width)
            if fixed != value:
                changes[name] = fixed
    rules = tuple(storable_text(rule, _RULE_MAX) for rule in record.applied_rules)
    if not changes and rules == record.applied_rules:
        return record
    flags = tuple(f"{SANITIZED_FLAG}:{name}" for name in changes)
    if rules != record.applied_rules:
        flags += (f"{SANITIZED_FLAG}:applied_rules",)
    return replace(record, **changes, applied_rules=rules + flags)
