"""Traces: building, re-blocking into larger pages, trace files (write, read back, errors), size and TTL options."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from db.chains import RequestChain
from db.simulation import Trace, TraceError, TraceRequest, export_trace, read_trace, read_trace_requests, simulate
from db.simulation.synthetic import synthetic_trace
from db.simulation.units import format_size, format_ttl, parse_list, parse_size, parse_ttl


def test_requests_are_replayed_in_time_order() -> None:
    trace = Trace.from_requests(
        [TraceRequest(5, 2, (1, 2), 1), TraceRequest(1, 1, (1,), 1), TraceRequest(5, 3, (7, 8, 9), 1)]
    )
    assert trace.timestamps_s == (1.0, 5.0, 5.0)
    assert [request.hash_ids for request in trace.requests()] == [(1,), (1, 2), (7, 8, 9)]  # ties keep their order
    assert (trace.num_requests, trace.num_blocks, trace.prompt_tokens) == (3, 6, 6)


def test_reblocking_keeps_the_last_hash_of_each_full_page() -> None:
    request = TraceRequest(0, 11, (1, 2, 3, 4, 5), 2)
    assert Trace.from_requests([request], page_size=4).hashes == (2, 4)
    assert Trace.from_requests([request], page_size=6).hashes == (3,)
    assert Trace.from_requests([request], page_size=12).hashes == ()
    trace = Trace.from_requests([request])
    assert trace.reblock(4).hashes == (2, 4) and trace.reblock(4).block_size == 4
    assert trace.reblock(2) is trace


def test_reblocked_pages_hit_as_an_engine_with_larger_pages_would() -> None:
    # Two prompts share 6 tokens (three 2-token blocks), then differ: with 4-token pages only the first page is shared.
    first = TraceRequest(0, 8, (1, 2, 3, 4), 2)
    second = TraceRequest(1, 8, (1, 2, 3, 9), 2)
    assert simulate(Trace.from_requests([first, second]), None, "lru").hit_tokens == 6
    assert simulate(Trace.from_requests([first, second], page_size=4), None, "lru").hit_tokens == 4


def test_page_size_must_be_a_multiple_of_the_recorded_block_size() -> None:
    with pytest.raises(TraceError, match="not a multiple of the recorded block size 4"):
        Trace.from_requests([TraceRequest(0, 8, (1, 2), 4)], page_size=6)
    with pytest.raises(TraceError, match="not a multiple"):
        Trace.from_requests([TraceRequest(0, 8, (1, 2), 4)]).reblock(2)


def test_mixed_block_sizes_need_a_common_page_size() -> None:
    requests = [TraceRequest(0, 8, (1, 2), 4), TraceRequest(1, 8, (3, 4, 5, 6), 2)]
    with pytest.raises(TraceError, match="mixes block sizes 2, 4"):
        Trace.from_requests(requests)
    trace = Trace.from_requests(requests, page_size=8)
    assert (trace.block_size, trace.hashes) == (8, (2, 6))


def test_bad_chains_are_refused() -> None:
    with pytest.raises(TraceError, match="repeats a hash"):
        Trace.from_requests([TraceRequest(0, 3, (1, 2, 1), 1)])
    with pytest.raises(TraceError, match="negative input length"):
        Trace.from_requests([TraceRequest(0, -1, (), 1)])


def test_export_and_read_back(tmp_path: Path) -> None:
    requests = [
        TraceRequest(100.0, 40, (5, 2**63 - 1, -3), 16),
        TraceRequest(100.25, 17, (5,), 16, approximate=True),
        TraceRequest(102.5, 0, (), 16),
    ]
    path = tmp_path / "trace.jsonl"
    assert export_trace(requests, path) == 3
    lines = path.read_text().splitlines()
    assert lines[0] == '{"timestamp":0,"input_length":40,"hash_ids":[5,9223372036854775807,-3],"block_size":16}'
    assert lines[1].endswith('"approximate":true}')
    read = list(read_trace_requests(path))
    # Timestamps come back in seconds since the first request (written as whole milliseconds).
    assert read == [
        TraceRequest(0.0, 40, (5, 2**63 - 1, -3), 16),
        TraceRequest(0.25, 17, (5,), 16, approximate=True),
        TraceRequest(2.5, 0, (), 16),
    ]
    trace = read_trace(path)
    assert trace.num_approximate == 1
    original = Trace.from_requests(requests)
    for policy in ("lru", "fifo", "optimal"):
        assert simulate(trace, 32, policy, 1.0) == simulate(original, 32, policy, 1.0)


def test_export_stored_chain_rows() -> None:
    start = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
    rows = [
        (start, "acme", RequestChain(block_size=16, input_length=40, hash_ids=(1, 2))),
        (start.replace(tzinfo=None) + timedelta(milliseconds=1500), "acme", RequestChain(16, 20, (1,), True)),
    ]
    out = io.StringIO()
    assert export_trace(rows, out) == 2
    assert [request.timestamp_s for request in read_trace_requests(io.StringIO(out.getvalue()))] == [0.0, 1.5]


def test_synthetic_trace_round_trips(tmp_path: Path) -> None:
    requests = synthetic_trace(3000, seed=1)
    path = tmp_path / "synthetic.jsonl"
    export_trace(requests, path)
    original, read = Trace.from_requests(requests), read_trace(path)
    assert read.hashes == original.hashes and read.input_lengths == original.input_lengths
    assert simulate(read, 10_000, "optimal", 60.0).hit_tokens == simulate(original, 10_000, "optimal", 60.0).hit_tokens


def test_mooncake_lines_without_a_block_size() -> None:
    line = '{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]}\n'
    with pytest.raises(TraceError, match="line 1 has no 'block_size'.*512"):
        read_trace(io.StringIO(line))
    trace = read_trace(io.StringIO(line), block_size=512)
    assert (trace.block_size, trace.timestamps_s, trace.hashes) == (512, (27.482,), (46, 47))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "line 2 is not JSON"),
        ("[1, 2]", "line 2 is not a JSON object"),
        ('{"timestamp": "x", "input_length": 1, "hash_ids": [], "block_size": 1}', "'timestamp'"),
        ('{"timestamp": 0, "input_length": 1, "hash_ids": [1.5], "block_size": 1}', "'hash_ids'"),
        ('{"timestamp": 0, "input_length": -1, "hash_ids": [], "block_size": 1}', "'input_length'"),
        ('{"timestamp": 0, "input_length": 1, "hash_ids": [], "block_size": 0}', "'block_size'"),
    ],
)
def test_malformed_lines_are_named(text: str, message: str) -> None:
    good = '{"timestamp": 0, "input_length": 1, "hash_ids": [1], "block_size": 1}'
    with pytest.raises(TraceError, match=message):
        read_trace(io.StringIO(f"{good}\n{text}\n"))


def test_missing_file() -> None:
    with pytest.raises(TraceError, match="cannot open trace file"):
        read_trace("/nonexistent/trace.jsonl")


def test_sizes_and_ttls() -> None:
    assert parse_list("100k, 1M,10M,2.5M,512,inf", parse_size) == [100_000, 1_000_000, 10_000_000, 2_500_000, 512, None]
    assert parse_list("none,90s,5m,1h,7d,30", parse_ttl) == [None, 90.0, 300.0, 3600.0, 604800.0, 30.0]
    assert [format_size(size) for size in (100_000, 1_000_000, 2_500_000, 512, None)] == [
        "100k",
        "1M",
        "2.5M",
        "512",
        "inf",
    ]
    assert [format_ttl(ttl) for ttl in (None, 90.0, 300.0, 3600.0, 1.5)] == ["none", "90s", "5m", "1h", "1.5s"]
    for bad, parse in (("10q", parse_size), ("soon", parse_ttl), (" , ", parse_size)):
        with pytest.raises(ValueError):
            parse_list(bad, parse)
