"""Test support for the gateway: servers in background threads, a scriptable stub upstream, a fake storage.

Everything listens on 127.0.0.1 on free ports.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import uvicorn
from stub_upstream import StubState as StubState  # re-exported for the tests
from stub_upstream import StubUpstream as StubUpstream

from db.held_record import HeldRecord
from gateway.app import create_app
from gateway.auth import KeySnapshot
from gateway.config import GatewayConfig, TenantSettings, UpstreamConfig, WriterConfig
from gateway.storage import DatabaseStorage, StorageConfig


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def closed_port() -> int:
    """A port nothing listens on (bound then released)."""
    return free_port()


@contextmanager
def serve_in_thread(app: Any, port: int | None = None) -> Iterator[str]:
    """Run an ASGI app under uvicorn in a background thread; yields its base URL."""
    port = port or free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="auto", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("server thread died during start-up")
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


# --- gateways ------------------------------------------------------------------------------------------------------

TEST_SECRET = "test-server-secret"


@dataclass
class RunningGateway:
    url: str
    config: GatewayConfig
    storage: Any

    @property
    def records(self) -> list[Any]:
        """Records submitted so far. A record is submitted just after the last response byte, so use
        `wait_records` right after a response."""
        return self.storage.sink.records

    def wait_records(self, count: int, timeout_s: float = 10.0) -> list[Any]:
        """Wait until at least `count` records were submitted (bounded), then return them all."""
        deadline = time.monotonic() + timeout_s
        while len(self.storage.sink.records) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return list(self.storage.sink.records)


def gateway_config(upstream_url: str, **changes: Any) -> GatewayConfig:
    base = GatewayConfig(
        upstreams=(UpstreamConfig(name="stub", url=upstream_url, kind="local_engine", timeout_s=30.0),),
        default_upstream="stub",
        server_secret=TEST_SECRET,
        key_refresh_interval_s=0.1,
        # Uplift checks and rule advice are random samples; tests that want them turn them on.
        tenant_defaults=TenantSettings(uplift_sample_rate=0.0, advice_sample_rate=0.0),
        # Test gateways run open on purpose (the operator's explicit choice); tests of keys pass auth="keys".
        auth="none",
        key_snapshot_path=None,
    )
    return replace(base, **changes)


@contextmanager
def running_gateway(config: GatewayConfig, storage: Any | None = None) -> Iterator[RunningGateway]:
    storage = storage if storage is not None else FakeStorage()
    with serve_in_thread(create_app(config, storage)) as url:
        yield RunningGateway(url=url, config=config, storage=storage)


# --- fake storage ----------------------------------------------------------------------------------------------


@dataclass
class FakeCounters:
    queued: int = 0
    written: int = 0
    spilled: int = 0
    replayed: int = 0
    dropped: int = 0
    pending_spill: int = 0
    rejected: int = 0
    lost: int = 0


class FakeSink:
    def __init__(self) -> None:
        self.records: list[Any] = []
        self._counters = FakeCounters()

    def submit(self, record: Any) -> bool:
        self.records.append(record)
        self._counters.queued += 1
        self._counters.written += 1
        return True

    def hold(self, record: Any) -> HeldRecord:
        return HeldRecord(record.request_id, self.submit)

    def counters(self) -> FakeCounters:
        return self._counters


@dataclass(frozen=True)
class FakeKey:
    key_id: str
    tenant: str
    is_admin: bool
    secret: str


class FakeStorage:
    """In-memory keys and records; `stats` returns what the test put in `stats_rows`; no conversations."""

    def __init__(self) -> None:
        self.sink = FakeSink()
        self.keys: dict[str, FakeKey] = {}
        self.revoked: set[str] = set()
        self.stats_rows: list[dict[str, Any]] = []
        self.stats_calls: list[dict[str, Any]] = []

    def add_key(self, key_id: str, tenant: str, *, is_admin: bool = False) -> str:
        secret = f"sk-{key_id}-secret"
        self.keys[key_id] = FakeKey(key_id, tenant, is_admin, secret)
        return secret

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def load_keys(self) -> KeySnapshot:
        active = {k.key_id: k for k in self.keys.values() if k.key_id not in self.revoked}
        revoked = {k.key_id: k for k in self.keys.values() if k.key_id in self.revoked}
        return KeySnapshot(entries=active, any_key_exists=bool(self.keys), revoked=revoked)

    @staticmethod
    def verify_key(plaintext: str, entries: Any) -> Any:
        import hmac

        for entry in entries.values():
            if hmac.compare_digest(entry.secret.encode(), plaintext.encode()):
                return entry
        return None

    async def stats(self, since: Any, until: Any, bucket: str, group_by: str | None, tenant: str | None) -> list[Any]:
        self.stats_calls.append(
            {"since": since, "until": until, "bucket": bucket, "group_by": group_by, "tenant": tenant}
        )
        return [row for row in self.stats_rows if tenant is None or row.get("tenant") == tenant]

    async def conversations(self, since: Any, until: Any, tenant: str | None, limit: int) -> list[Any]:
        return []

    async def conversation(self, conversation_id: str, tenant: str | None) -> Any | None:
        return None


# --- a TCP proxy whose plug can be pulled (database outages) -----------------------------------------------------


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target`; `stop()` refuses new connections and cuts open ones, `start()`
    listens again on the same port. Runs its own event loop in a thread."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def start(self) -> None:
        self._call(self._start())

    def stop(self) -> None:
        self._call(self._stop())

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update((client_writer, upstream_writer))

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                writer.transport.abort()
                self._writers.discard(writer)

        await asyncio.gather(pipe(client_reader, upstream_writer), pipe(upstream_reader, client_writer))


# --- database-backed storage ----------------------------------------------------------------------------------------


def db_storage(url: str, tmp_path: Path, **recorder_changes: Any) -> DatabaseStorage:
    recorder = WriterConfig(
        spill_path=tmp_path / "spill" / "requests.jsonl", flush_interval_s=0.05, batch_size=64, replay_interval_s=0.2
    )
    return DatabaseStorage(
        StorageConfig(
            database_url=url,
            recorder=replace(recorder, **recorder_changes),
            key_snapshot_path=tmp_path / "key_snapshot.json",
        )
    )


def wait_until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    """Poll `predicate` until it holds (bounded: background work such as the record writer needs a moment)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
