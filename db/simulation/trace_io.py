"""Trace files: one JSON object per line, the format of Mooncake's published traces plus the block size.

    {"timestamp": 1520, "input_length": 4107, "hash_ids": [8410..., 1337..., ...], "block_size": 16}

`timestamp` is in integer milliseconds since the first exported request, as in Mooncake's traces (which replay tools
such as vLLM's and Mooncake's own benchmarks read); `block_size` is the tokens per hashed block (Mooncake's traces
leave it out and use 512, so `read_trace` takes a default for lines without one). A request whose chain the gateway
approximated from text, not from the engine's tokens, also carries `"approximate": true`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from db.simulation.trace import Trace, TraceError, TraceRequest
from db.timeutil import as_utc

if TYPE_CHECKING:
    from db.chains import RequestChain

TraceSource = str | Path | IO[str]
# What `export_trace` takes: the rows of `db.queries.iter_chains` or requests of an existing trace.
ExportItem = tuple[datetime, str, "RequestChain"] | TraceRequest


def trace_request_from_chain(created_at: datetime, chain: RequestChain) -> TraceRequest:
    """A stored request chain as a trace request, timed in seconds since the epoch (a naive time is UTC)."""
    return TraceRequest(
        timestamp_s=as_utc(created_at).timestamp(),
        input_length=chain.input_length,
        hash_ids=tuple(chain.hash_ids),
        block_size=chain.block_size,
        approximate=chain.approximate,
    )


def _as_request(item: ExportItem) -> TraceRequest:
    if isinstance(item, TraceRequest):
        return item
    created_at, _tenant, chain = item
    return trace_request_from_chain(created_at, chain)


def export_trace(records: Iterable[ExportItem], out_file: TraceSource) -> int:
    """Write `records` as trace lines to `out_file` (a path or an open text file); returns the lines written.

    Timestamps become integer milliseconds since the first record, so pass records in time order (as
    `db.queries.iter_chains` yields them); an earlier record after the first gets a negative timestamp.
    """
    with ExitStack() as stack:
        out = out_file if not isinstance(out_file, str | Path) else stack.enter_context(_open(out_file, "w"))
        origin: float | None = None
        written = 0
        for item in records:
            request = _as_request(item)
            if origin is None:
                origin = request.timestamp_s
            line: dict[str, Any] = {
                "timestamp": round((request.timestamp_s - origin) * 1000),
                "input_length": request.input_length,
                "hash_ids": list(request.hash_ids),
                "block_size": request.block_size,
            }
            if request.approximate:
                line["approximate"] = True
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
            written += 1
    return written


def read_trace_requests(source: TraceSource, block_size: int | None = None) -> Iterator[TraceRequest]:
    """The requests of a trace file, in file order, with timestamps in seconds.

    `block_size` is used for lines that do not state one (Mooncake's traces: 512). Raises `TraceError` naming the
    line for anything malformed.
    """
    with ExitStack() as stack:
        lines = source if not isinstance(source, str | Path) else stack.enter_context(_open(source, "r"))
        for number, text in enumerate(lines, start=1):
            if text.strip():
                yield _parse_line(text, number, block_size)


def read_trace(source: TraceSource, page_size: int | None = None, block_size: int | None = None) -> Trace:
    """A trace file as a `Trace` ready to replay, re-blocked to `page_size` tokens when given (see `Trace`)."""
    return Trace.from_requests(read_trace_requests(source, block_size), page_size=page_size)


def _open(path: str | Path, mode: str) -> IO[str]:
    try:
        return open(path, mode, encoding="utf-8")  # closed by the caller's ExitStack
    except OSError as exc:
        raise TraceError(f"cannot open trace file {str(path)!r}: {exc.strerror or exc}") from exc


def _integer(data: dict[str, Any], key: str, number: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"trace line {number}: {key!r} must be an integer, got {value!r}")
    return value


def _parse_line(text: str, number: int, default_block_size: int | None) -> TraceRequest:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"trace line {number} is not JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise TraceError(f"trace line {number} is not a JSON object")
    timestamp = data.get("timestamp")
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
        raise TraceError(f"trace line {number}: 'timestamp' (milliseconds) must be a number, got {timestamp!r}")
    hash_ids = data.get("hash_ids")
    if not isinstance(hash_ids, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in hash_ids):
        raise TraceError(f"trace line {number}: 'hash_ids' must be a list of integers")
    if "block_size" in data or default_block_size is None:
        if "block_size" not in data:
            raise TraceError(
                f"trace line {number} has no 'block_size'; give the trace's block size (Mooncake's traces use 512)"
            )
        block_size = _integer(data, "block_size", number)
    else:
        block_size = default_block_size
    if block_size < 1:
        raise TraceError(f"trace line {number}: 'block_size' must be at least 1, got {block_size}")
    input_length = _integer(data, "input_length", number)
    if input_length < 0:
        raise TraceError(f"trace line {number}: 'input_length' must not be negative, got {input_length}")
    return TraceRequest(
        timestamp_s=timestamp / 1000,
        input_length=input_length,
        hash_ids=tuple(hash_ids),
        block_size=block_size,
        approximate=data.get("approximate") is True,
    )
