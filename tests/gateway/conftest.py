"""Fixtures for the gateway tests: a stub upstream and gateways running in background threads."""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).parent))

from gateway_testkit import FakeStorage, StubState, StubUpstream, serve_in_thread  # noqa: E402

from gateway.app import create_app  # noqa: E402
from gateway.config import GatewayConfig, TenantSettings, UpstreamConfig  # noqa: E402

TEST_SECRET = "test-server-secret"


@pytest.fixture(scope="session")
def stub_server() -> Iterator[tuple[StubUpstream, str]]:
    stub = StubUpstream()
    with serve_in_thread(stub) as url:
        yield stub, url


@pytest.fixture
def stub(stub_server: tuple[StubUpstream, str]) -> StubUpstream:
    """The stub upstream with fresh state for this test."""
    stub_server[0].state = StubState()
    return stub_server[0]


@pytest.fixture
def stub_url(stub_server: tuple[StubUpstream, str]) -> str:
    return stub_server[1]


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
        tenant_defaults=TenantSettings(),
    )
    return replace(base, **changes)


@contextmanager
def running_gateway(config: GatewayConfig, storage: Any | None = None) -> Iterator[RunningGateway]:
    storage = storage if storage is not None else FakeStorage()
    with serve_in_thread(create_app(config, storage)) as url:
        yield RunningGateway(url=url, config=config, storage=storage)


@pytest.fixture
def gateway(stub: StubUpstream, stub_url: str) -> Iterator[RunningGateway]:
    """An open-mode gateway (no keys) in front of the stub, with a fake storage."""
    with running_gateway(gateway_config(stub_url)) as running:
        yield running


def _postgres_admin_url() -> str:
    return os.environ.get("PREFIXSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/postgres")


def _postgres_reachable() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def postgres_database():
    """A fresh database on the local PostgreSQL server, dropped afterwards."""
    if not _postgres_reachable():
        message = "PostgreSQL is not reachable on 127.0.0.1:5432"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    name = f"gateway_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(_postgres_admin_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
