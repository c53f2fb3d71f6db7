"""Helpers for the dashboard tests: hand-made request history with known figures, and a stand-in engine cache API."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from db.engine import create_sync_engine_for
from db.migrate import upgrade
from db.records import RequestRecord
from db.store import store_records
from db.timeutil import utc_now

PREFIX_ALPHA = "a" * 32
PREFIX_BETA = "b" * 32
ALPHA_PROMPT_TEXT = "You are the Alpha support assistant. Answer briefly."


def _record(index: int, created_at: datetime, **fields: Any) -> RequestRecord:
    defaults: dict[str, Any] = {
        "request_id": f"req-{index:03d}",
        "created_at": created_at,
        "tenant": "alpha",
        "key_id": "key-alpha",
        "endpoint": "chat.completions",
        "model": "m-small",
        "upstream": "local-engine",
        "stream": False,
        "status_code": 200,
        "error_type": None,
        "prompt_tokens": 1000,
        "cached_tokens": 0,
        "completion_tokens": 50,
        "ttft_ms": 100.0,
        "latency_ms": 400.0,
        "applied_rules": (),
        "miss_kind": None,
        "prefix_hash": None,
        "prompt_text": None,
        "diverged_at_token": None,
    }
    defaults.update(fields)
    return RequestRecord(**defaults)


def seeded_records(now: datetime | None = None) -> list[RequestRecord]:
    """Eight requests in the last hour (well inside every range the tests pick), figures chosen by hand.

    Known cache figures: cached 3*900 + 448 + 0 + 0 = 3148 of 8000 prompt tokens; 4 of 6 requests hit.
    One request has unknown cached tokens (an upstream that does not report them) and one failed.
    """
    moment = (now or utc_now()) - timedelta(minutes=50)
    step = timedelta(minutes=5)
    hit = {"cached_tokens": 900, "miss_kind": "hit", "ttft_ms": 20.0, "prefix_hash": PREFIX_ALPHA}
    return [
        _record(1, moment, **hit, applied_rules=("canonical_json_keys",), prompt_text=ALPHA_PROMPT_TEXT),
        _record(2, moment + step, **hit, applied_rules=("canonical_json_keys", "newline_normalization")),
        _record(3, moment + 2 * step, **hit),
        _record(
            4,
            moment + 3 * step,
            cached_tokens=448,
            miss_kind="partial",
            ttft_ms=60.0,
            prefix_hash=PREFIX_ALPHA,
            diverged_at_token=448,
            miss_reason="system_changed",
            divergence_segment="system",
            divergence_char_offset=1830,
            divergence_source="engine",
            recomputed_tokens=552,
            template_tokens=3,
            applied_rules=("canonical_tool_order",),
        ),
        _record(
            5,
            moment + 4 * step,
            tenant="beta",
            model="m-large",
            prompt_tokens=2000,
            cached_tokens=0,
            miss_kind="cold",
            ttft_ms=300.0,
            prefix_hash=PREFIX_BETA,
            diverged_at_token=0,
            applied_rules=("newline_normalization",),
        ),
        _record(
            6,
            moment + 5 * step,
            tenant="beta",
            model="m-large",
            prompt_tokens=2000,
            cached_tokens=0,
            miss_kind="evicted",
            ttft_ms=320.0,
            prefix_hash=PREFIX_BETA,
        ),
        _record(
            7,
            moment + 6 * step,
            tenant="beta",
            model="m-large",
            upstream="hosted",
            prompt_tokens=500,
            cached_tokens=None,
            ttft_ms=100.0,
        ),
        _record(
            8,
            moment + 7 * step,
            tenant="beta",
            model="m-large",
            status_code=500,
            error_type="upstream_error",
            prompt_tokens=None,
            cached_tokens=None,
            completion_tokens=None,
            ttft_ms=None,
        ),
    ]


@dataclass(frozen=True)
class ExpectedFigures:
    """Figures computed straight from the records, the way the dashboard must show them."""

    requests: int
    prompt_tokens: int
    cached_tokens: int
    token_hit_rate: float
    request_hit_share: float


def expected_figures(records: list[RequestRecord]) -> ExpectedFigures:
    known = [r for r in records if r.prompt_tokens is not None and r.cached_tokens is not None]
    with_cache = [r for r in records if r.cached_tokens is not None]
    return ExpectedFigures(
        requests=len(records),
        prompt_tokens=sum(r.prompt_tokens or 0 for r in records),
        cached_tokens=sum(r.cached_tokens or 0 for r in records),
        token_hit_rate=sum(r.cached_tokens or 0 for r in known) / sum(r.prompt_tokens or 0 for r in known),
        request_hit_share=sum(1 for r in with_cache if (r.cached_tokens or 0) > 0) / len(with_cache),
    )


def create_database(path: Path, records: list[RequestRecord]) -> str:
    """A migrated SQLite database at `path` holding `records`; returns its URL."""
    url = f"sqlite:///{path}"
    upgrade(url)
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as conn:
            store_records(conn, records)
    finally:
        engine.dispose()
    return url


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def closed_port_url() -> str:
    """A URL nothing listens on (the port was free a moment ago)."""
    return f"http://127.0.0.1:{free_port()}"


def _node(
    node_id: int, num_tokens: int, hit_count: int, children: list[dict[str, Any]] | None = None, locked: bool = False
) -> dict[str, Any]:
    return {
        "id": node_id,
        "num_tokens": num_tokens,
        "hit_count": hit_count,
        "last_access_s": 1.5 * node_id,
        "locked": locked,
        "children": children or [],
    }


def engine_tree_payload() -> dict[str, Any]:
    """Two namespaces, seven nodes, 1,024 cached tokens in all, in the engine's `/v1/cache/tree` shape."""
    return {
        "namespaces": [
            {
                "namespace": "5a1t0001",
                "root": _node(0, 0, 0, [_node(1, 512, 9, [_node(2, 128, 4), _node(3, 64, 1, locked=True)])]),
            },
            {"namespace": "5a1t0002", "root": _node(0, 0, 0, [_node(1, 256, 2, [_node(2, 64, 0)])])},
        ],
        "truncated": False,
    }


ENGINE_TREE_TOTAL_TOKENS = 1024
ENGINE_TREE_NUM_NODES = 7


def engine_stats_payload(prefill_tokens_per_s: float | None = 1000.0) -> dict[str, Any]:
    # The real engine reports free rather than used slots; 32 used slots belong to a running request.
    return {
        "capacity_tokens": 4096,
        "free_tokens": 4096 - 1056,
        "cached_tokens": 1024,
        "evictable_tokens": 960,
        "protected_tokens": 64,
        "num_nodes": 7,
        "evicted_tokens_total": 2048,
        "expired_tokens_total": 128,
        "eviction": "lru",
        "active_requests": 1,
        "prefill_tokens_per_s": prefill_tokens_per_s,
    }


@dataclass
class FakeEngineState:
    stats: dict[str, Any] = field(default_factory=engine_stats_payload)
    tree: dict[str, Any] = field(default_factory=engine_tree_payload)
    tree_queries: list[str] = field(default_factory=list)


@contextmanager
def fake_engine(state: FakeEngineState | None = None) -> Iterator[tuple[str, FakeEngineState]]:
    """Serve `GET /v1/cache` and `GET /v1/cache/tree` from `state` on a free local port, in a thread."""
    current = state or FakeEngineState()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path, _, query = self.path.partition("?")
            if path == "/v1/cache":
                body = current.stats
            elif path == "/v1/cache/tree":
                current.tree_queries.append(query)
                body = current.tree
            else:
                self.send_error(404)
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", current
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
