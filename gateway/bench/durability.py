"""What `spill_first` adds to the request path, measured in-process: encoding a record and appending it to the journal.

That is all the mode does on the request path (the fsync runs in a worker thread every few milliseconds), so timing
those two steps one record at a time gives a figure that end-to-end latency under a shared, busy machine cannot.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from db.chains import RequestChain
from db.journal import Journal
from db.records import RequestRecord


def _record(num_blocks: int) -> RequestRecord:
    return RequestRecord(
        request_id=str(uuid.uuid4()),
        created_at=datetime.now(UTC),
        tenant="default",
        key_id=None,
        endpoint="chat.completions",
        model="bench",
        upstream="local",
        stream=False,
        status_code=200,
        error_type=None,
        prompt_tokens=num_blocks * 16 + 7,
        cached_tokens=num_blocks * 16,
        completion_tokens=8,
        ttft_ms=1.5,
        latency_ms=2.5,
        applied_rules=("tool_schema_key_order", "tool_order"),
        miss_kind="partial",
        prefix_hash="0123456789abcdef",
        miss_reason="new_suffix",
        recomputed_tokens=7,
        chain=RequestChain(16, num_blocks * 16 + 7, tuple(range(1 << 40, (1 << 40) + num_blocks))),
        hash_key_version=1,
    )


def measure_journal_append(num_records: int = 5000, num_blocks: int = 32) -> dict[str, Any]:
    """Per-record microseconds of `to_json` + `Journal.append` (p50, p99), on a record with a `num_blocks` chain."""
    timings: list[float] = []
    with tempfile.TemporaryDirectory(prefix="prefixscope-journal-") as directory:
        journal = Journal(Path(directory) / "requests.jsonl")
        records = [_record(num_blocks) for _ in range(num_records)]
        for record in records:
            started = time.perf_counter()
            journal.append(record.to_json())
            timings.append((time.perf_counter() - started) * 1e6)
        journal.close(remove=True)
    timings.sort()
    return {
        "records": num_records,
        "chain_blocks": num_blocks,
        "p50_us": round(statistics.median(timings), 1),
        "p99_us": round(timings[int(len(timings) * 0.99) - 1], 1),
    }
