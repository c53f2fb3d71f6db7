"""The engines and the gateway the benchmark sends through, started as the programs a user runs.

Two engines (`prefixscope engine`, SmolLM2 on the CPU): 16-token pages, a small pool and a short idle TTL, so that
eviction and expiry happen in seconds. One gateway (`prefixscope gateway`, its own state directory and SQLite
database) in front of them: upstream `main` is the first engine (models `smollm2` and `SmolLM2-135M-Instruct`),
upstream `pair` is both engines routed round robin (model `HuggingFaceTB/SmolLM2-135M-Instruct`). API keys per
tenant; normalization off and no sampled dry runs, so that each request reaches the engine as the client wrote it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.bench.explain.conversation import Reply
from gateway.bench.explain.kinds import EVICTED_TENANT
from gateway.bench.explain.material import MAIN_MODEL, PAIR_MODEL
from gateway.bench.explain.settings import EngineSettings
from gateway.bench.processes import free_port, spawn, stop, wait_healthy
from gateway.config.tenant import ALL_RULES

SESSION_HEADER = "x-prefixscope-session"  # the conversation id a client names (docs/conversations.md)


class Program:
    """One child process and its log file."""

    def __init__(self, command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self.process = spawn(command, log, env)

    def wait_healthy(self, url: str) -> None:
        try:
            wait_healthy(url, self.process)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; see {self.log}") from None

    def stop(self) -> None:
        stop(self.process)


def _engine(settings: EngineSettings, workdir: Path, name: str) -> tuple[str, Program]:
    port = free_port()
    command = [sys.executable, "-m", "prefixscope", "engine", "--model", settings.model, "--device", "cpu",
               "--port", str(port), "--log-level", "warning", "--page-size", str(settings.page_size),
               "--kv-cache-tokens", str(settings.pool_tokens), "--ttl", f"{settings.ttl_s:g}"]
    return f"http://127.0.0.1:{port}", Program(command, workdir / f"{name}.log")


def gateway_config(main_url: str, pair_urls: list[str]) -> str:
    """The gateway's TOML: upstreams, the route to the pair, tenants that send their prompts as written (and the
    evicted kind's tenant with a retention class longer than the engines' TTL)."""
    rules = ", ".join(f"{rule} = false" for rule in ALL_RULES)
    return (
        '[gateway]\ndefault_upstream = "main"\nauth = "keys"\nkey_refresh_interval_s = 1.0\n\n'
        f'[[upstreams]]\nname = "main"\nurl = "{main_url}"\nkind = "local_engine"\ntimeout = 600\n\n'
        f'[[upstreams]]\nname = "pair"\nkind = "local_engine"\nreplicas = {json.dumps(pair_urls)}\n'
        'routing = "round_robin"\ntimeout = 600\n'
        "[upstreams.router]\nevents = false\nhealth_interval = 5.0\nhealth_timeout = 60.0\n\n"
        f'[routes]\n"{PAIR_MODEL}" = "pair"\n\n'
        f"[tenant_defaults]\nrules = {{ {rules} }}\nuplift_sample_rate = 0.0\nadvice_sample_rate = 0.0\n\n"
        # Kept past the engines' TTL, so that its prefix is evicted by other tenants' prompts before it could expire.
        f'[tenants.{EVICTED_TENANT}]\ncache_retention = "5m"\n'
    )


def create_keys(database_url: str, tenants: list[str]) -> dict[str, str]:
    """Migrate the database and create one API key per tenant: tenant -> plaintext key."""
    from sqlalchemy import create_engine

    from db.keys import create_api_key
    from db.migrate import upgrade

    upgrade(database_url)
    engine = create_engine(database_url)
    try:
        return {tenant: create_api_key(engine, tenant).plaintext_key for tenant in tenants}
    finally:
        engine.dispose()


def _warm(url: str) -> None:
    """The first forward passes of a process are slow: keep them out of the conversations."""
    for n in range(2):
        body = {"model": MAIN_MODEL, "messages": [{"role": "user", "content": f"warm-up {n} " * 40}], "max_tokens": 2}
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600).raise_for_status()


@dataclass
class Deployment:
    """A running gateway (`url`) with a key per tenant, over `engine_urls`, recording into `database_url`."""

    url: str
    engine_urls: list[str]
    database_url: str
    keys: dict[str, str]
    client: httpx.Client

    def send(self, tenant: str, body: dict[str, Any], session: str | None = None) -> Reply:
        headers = {"authorization": f"Bearer {self.keys[tenant]}"}
        if session is not None:
            headers[SESSION_HEADER] = session
        try:
            response = self.client.post(f"{self.url}/v1/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"the gateway did not answer: {exc}") from None
        if response.status_code != 200:
            raise RuntimeError(f"the gateway answered {response.status_code}: {response.text[:500]}")
        return Reply(response.headers["x-request-id"], response.json()["choices"][0]["message"])

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def rows(self, ids: list[str], timeout_s: float = 60.0) -> dict[str, dict[str, Any]]:
        """The stored `requests` rows of `ids` (waiting for the writer to store them all, up to `timeout_s`)."""
        from sqlalchemy import bindparam, create_engine, text

        engine = create_engine(self.database_url)
        query = text("SELECT * FROM requests WHERE id IN :ids").bindparams(bindparam("ids", expanding=True))
        found: dict[str, dict[str, Any]] = {}
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                with engine.connect() as conn:
                    found = {row["id"]: row for row in (dict(r._mapping) for r in conn.execute(query, {"ids": ids}))}
                if len(found) >= len(set(ids)) or time.monotonic() > deadline:
                    return found
                time.sleep(0.5)
        finally:
            engine.dispose()


@contextmanager
def deployed(settings: EngineSettings, tenants: list[str], workdir: Path) -> Iterator[Deployment]:
    """Start both engines and the gateway; yields the deployment; stops them all."""
    with ExitStack() as stack:
        engines = [_engine(settings, workdir, f"engine-{n}") for n in (1, 2)]
        for _, program in engines:
            stack.callback(program.stop)
        database_url = f"sqlite:///{workdir / 'gateway.db'}"
        keys = create_keys(database_url, tenants)
        for url, program in engines:
            program.wait_healthy(url)
            _warm(url)
        urls = [url for url, _ in engines]
        config = workdir / "prefixscope.toml"
        config.write_text(gateway_config(urls[0], urls))
        port = free_port()
        env = {**os.environ, "PREFIXSCOPE_HOME": str(workdir / "state")}
        command = [sys.executable, "-m", "prefixscope", "gateway", "--port", str(port), "--config", str(config),
                   "--database-url", database_url, "--log-level", "warning"]
        gateway = Program(command, workdir / "gateway.log", env)
        stack.callback(gateway.stop)
        url = f"http://127.0.0.1:{port}"
        gateway.wait_healthy(url)
        client = stack.enter_context(httpx.Client(timeout=600))
        yield Deployment(url, urls, database_url, keys, client)
