"""OTLP/protobuf encoding of finished spans, written straight to the wire format.

The OpenTelemetry exporter's encoder (`opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans`) builds
one protobuf object per span, attribute and value in Python: over a hundred microseconds per span of 25 attributes,
on the export thread, which holds the interpreter lock meanwhile and so delays the event loop. `encode_request` writes
the same `ExportTraceServiceRequest` bytes (the same fields in the same order: a test compares them byte for byte)
directly, several times faster, and can add each span's deferred attributes as it goes, without copying the span.

Spans with events or links, or with attribute values other than str, bool, int, float, bytes or sequences of them,
are not written here: `encode_request` returns None and the caller uses the SDK's encoder.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

# Wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32. A tag is (field number << 3) | wire type.
_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_FIXED32 = struct.Struct("<I")
# Span.flags: the parent's is-remote bit is known (0x100), and set when the parent is remote (0x200).
_FLAGS_LOCAL = b"\x85\x01" + _FIXED32.pack(0x100)
_FLAGS_REMOTE = b"\x85\x01" + _FIXED32.pack(0x300)



class NotEncodable(Exception):
    """A span this encoder does not write (the SDK's encoder does)."""


_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))
_MAX_CACHED_KEYS = 1024
_keys: dict[str, bytes] = {}  # attribute key -> its `KeyValue.key` field (keys repeat from span to span)


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if value < 0:
        value += 1 << 64  # int64 as two's complement, ten bytes
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the length and the payload."""
    size = len(payload)
    return tag + (_ONE_BYTE[size] if size < 0x80 else _varint(size)) + payload


def _any_value(value: Any) -> bytes:
    """An `AnyValue` message's bytes (without its own tag)."""
    kind = type(value)
    if kind is str:
        return _field(b"\x0a", value.encode("utf-8"))
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        if not -(1 << 63) <= value < 1 << 63:
            raise NotEncodable("an integer attribute outside int64")
        return b"\x18" + _varint(value)
    if kind is float:
        return b"\x21" + _DOUBLE.pack(value)
    if value is None:
        return b""
    if kind is bytes:
        return _field(b"\x3a", value)
    if isinstance(value, (tuple, list)):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(item)) for item in value))
    raise NotEncodable(f"attribute value of type {kind.__name__}")


def _key_values(tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
    """Each attribute as a `KeyValue` field under `tag`."""
    if not attributes:
        return []
    fields = []
    for key, value in attributes.items():
        encoded_key = _keys.get(key)
        if encoded_key is None:
            encoded_key = _field(b"\x0a", key.encode("utf-8"))
            if len(_keys) < _MAX_CACHED_KEYS:
                _keys[key] = encoded_key
        fields.append(_field(tag, encoded_key + _field(b"\x12", _any_value(value))))
    return fields


def _string(tag: bytes, value: str | None) -> bytes:
    return _field(tag, value.encode("utf-8")) if value else b""


def _span(span: ReadableSpan, extra: Mapping[str, Any] | None) -> bytes:
    """One `Span` message (without its tag); `extra` attributes follow the span's own."""
    if span.events or span.links or span.dropped_events or span.dropped_links:
        raise NotEncodable("a span with events or links")
    context = span.context
    parent = span.parent
    parts = [b"\x0a\x10" + context.trace_id.to_bytes(16, "big"), b"\x12\x08" + context.span_id.to_bytes(8, "big")]
    if context.trace_state is not None:
        parts.append(_string(b"\x1a", ",".join(f"{key}={value}" for key, value in context.trace_state.items())))
    if parent is not None:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    parts.append(_string(b"\x2a", span.name))
    kind = span.kind.value + 1  # the SDK's INTERNAL is 0, OTLP's SPAN_KIND_INTERNAL is 1
    parts.append(b"\x30" + _varint(kind))
    if span.start_time:
        parts.append(b"\x39" + _FIXED64.pack(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _FIXED64.pack(span.end_time))
    attributes = span.attributes
    if extra:
        attributes = {**attributes, **extra} if attributes else extra
    parts.extend(_key_values(b"\x4a", attributes))
    if span.dropped_attributes:
        parts.append(b"\x50" + _varint(span.dropped_attributes))
    status = span.status
    code = status.status_code.value
    parts.append(_field(b"\x7a", _string(b"\x12", status.description) + (b"\x18" + _varint(code) if code else b"")))
    parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
    return b"".join(parts)


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b""
    return b"".join((_string(b"\x0a", scope.name), _string(b"\x12", scope.version),
                     *_key_values(b"\x1a", scope.attributes)))


def encode_request(
    spans: Sequence[ReadableSpan], extra: Sequence[Mapping[str, Any] | None] | None = None
) -> bytes | None:
    """The serialized `ExportTraceServiceRequest` of `spans`, as the SDK's encoder writes it, the i-th span with
    `extra[i]` added to its attributes (a key in both: the extra value); None when a span is `NotEncodable` here (the
    caller then uses the SDK's encoder)."""
    groups: dict[Any, dict[Any, list[bytes]]] = {}
    try:
        for index, span in enumerate(spans):
            encoded = _span(span, None if extra is None else extra[index])
            groups.setdefault(span.resource, {}).setdefault(span.instrumentation_scope or None, []).append(encoded)
        out = []
        for resource, scopes in groups.items():
            scope_spans = [
                _field(
                    b"\x12",
                    _field(b"\x0a", _scope(scope))
                    + b"".join(_field(b"\x12", encoded) for encoded in encoded_spans)
                    + _string(b"\x1a", scope.schema_url if scope else None),
                )
                for scope, encoded_spans in scopes.items()
            ]
            resource_spans = (_field(b"\x0a", b"".join(_key_values(b"\x0a", resource.attributes)))
                              + b"".join(scope_spans) + _string(b"\x1a", resource.schema_url))
            out.append(_field(b"\x0a", resource_spans))
    except NotEncodable:
        return None
    return b"".join(out)
