"""Test support for runs against the real engine (`prefixscope engine --model smollm2` on the CPU) with a gateway
that records into SQLite: engine processes, API keys per tenant, and the stored rows of requests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from gateway_testkit import free_port, wait_until
from sqlalchemy import bindparam, create_engine, text

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2"


class EngineProcess:
    """One engine process: `start` returns at once (the model loads in the background), `wait_healthy` waits."""

    def __init__(self, *options: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"gateway-test-engine-{self.port}.log", "wb")  # noqa: SIM115
        command = [sys.executable, "-m", "prefixscope", "engine", "--model", MODEL, "--device", "cpu"]
        command += ["--port", str(self.port), "--log-level", "warning", *options]
        self._process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout_s: float = 300.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"the engine exited with {self._process.returncode}; see {self._log.name}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the engine did not become healthy")
            time.sleep(0.5)

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
        self._log.close()


@contextmanager
def running_engine(*options: str) -> Iterator[str]:
    """Start the engine with these extra options (`--page-size 16`, `--ttl 4`...); yields its base URL once healthy."""
    engine = EngineProcess(*options)
    try:
        yield engine.wait_healthy()
    finally:
        engine.stop()


def create_keys(database_url: str, tenants: list[str]) -> dict[str, str]:
    """Migrate the database and create one API key per tenant; returns tenant -> plaintext key."""
    from db.keys import create_api_key
    from db.migrate import upgrade

    upgrade(database_url)
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        return {tenant: create_api_key(engine, tenant).plaintext_key for tenant in tenants}
    finally:
        engine.dispose()


@contextmanager
def keyed_gateway(
    engine_url: str, tmp_path: Path, tenants: dict[str, Any]
) -> Iterator[tuple[str, dict[str, str], str]]:
    """A gateway in front of the engine at `engine_url` with one API key per tenant (name -> `TenantSettings`),
    recording into SQLite under `tmp_path`; yields (gateway URL, tenant -> key, database URL)."""
    from gateway_testkit import db_storage, gateway_config, running_gateway

    from gateway.config import UpstreamConfig

    database_url = f"sqlite:///{tmp_path}/gateway.db"
    keys = create_keys(database_url, list(tenants))
    config = gateway_config(
        engine_url,
        upstreams=(UpstreamConfig(name="engine", url=engine_url, kind="local_engine", timeout_s=300.0),),
        default_upstream="engine",
        tenants=tenants,
        auth="keys",
    )
    with running_gateway(config, db_storage(database_url, tmp_path)) as gw:
        yield gw.url, keys, database_url


def stored(database_url: str, table: str, key_column: str, ids: list[str]) -> dict[str, dict[str, Any]]:
    """Rows of `table` whose `key_column` is in `ids`, once all are there (the writer needs a moment)."""
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    query = text(f"SELECT * FROM {table} WHERE {key_column} IN :ids").bindparams(bindparam("ids", expanding=True))

    def fetch() -> dict[str, dict[str, Any]]:
        with engine.connect() as conn:
            rows = [dict(row._mapping) for row in conn.execute(query, {"ids": ids})]
        return {row[key_column]: row for row in rows}

    try:
        wait_until(lambda: len(fetch()) >= len(set(ids)))
        return fetch()
    finally:
        engine.dispose()
