"""The gateway under faults: the SQLite file deleted under load, the database down at start-up, a full spill disk,
and a SIGKILL with each durability mode. Loopback only; every wait is bounded."""

from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from gateway_testkit import TcpProxy, closed_port, db_storage, free_port, gateway_config, running_gateway, wait_until
from sqlalchemy import create_engine, text

from gateway.advisor.capacity import DEFAULT_MAX_PENDING

CHAT = {"model": "m", "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]}


def count_rows(url: str) -> int:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT COUNT(*) FROM requests")).scalar_one())
    finally:
        engine.dispose()


def test_sqlite_file_deleted_under_load_reports_only_rows_at_the_path(stub, stub_url, tmp_path):
    path = tmp_path / "gateway.db"
    url = f"sqlite:///{path}"
    storage = db_storage(url, tmp_path)
    sent = {"n": 0}
    lock = threading.Lock()

    def client(count: int) -> None:
        with httpx.Client() as http:
            for _ in range(count):
                assert http.post(f"{gw.url}/v1/chat/completions", json=CHAT).status_code == 200
                with lock:
                    sent["n"] += 1

    with running_gateway(gateway_config(stub_url), storage) as gw:
        client(40)
        assert wait_until(lambda: storage.sink.counters().written == 40)
        threads = [threading.Thread(target=client, args=(60,)) for _ in range(3)]
        for thread in threads:
            thread.start()
        assert wait_until(lambda: sent["n"] >= 100)
        path.unlink()  # under load
        for thread in threads:
            thread.join(timeout=60)
        assert sent["n"] == 220
        assert wait_until(lambda: (c := storage.sink.counters()).queued == 0 and c.written + c.lost == 220)
        health = httpx.get(f"{gw.url}/health").json()["records"]
        metrics = httpx.get(f"{gw.url}/metrics").text
    rows = count_rows(url)
    assert health["written"] == rows  # never a row reported that is not at the path
    assert health["written"] + health["lost"] == 220
    assert health["lost"] >= 40 and health["database_recreated"] == 1
    assert f"prefixscope_gateway_records_lost_total {float(health['lost'])}" in metrics


@pytest.mark.parametrize("journal_full", [True, False])
def test_a_full_spill_disk_with_the_database_down_is_counted_and_exported(
    journal_full, stub, stub_url, tmp_path, caplog, monkeypatch
):
    """The database is unreachable from the start (the gateway starts anyway) and the spill disk is full. With the
    journal full too every record is lost, and /health, /metrics and the error log say exactly how many; with the
    journal writable (spill_first, the default) none is lost: they are kept in the journal, exported as pending."""
    storage = db_storage(f"postgresql://root@127.0.0.1:{closed_port()}/absent", tmp_path)

    def no_space(fd: int, data: bytes, write: object = None) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    storage.sink._spill.write = no_space
    if journal_full:
        monkeypatch.setattr("db.journal.write_all", no_space)
    lost, pending = (5, 0) if journal_full else (0, 5)
    with running_gateway(gateway_config(stub_url), storage) as gw:
        for _ in range(5):
            assert httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT).status_code == 200
        counters = storage.sink.counters
        assert wait_until(lambda: (counters().lost, counters().journaled_pending) == (lost, pending))
        health = httpx.get(f"{gw.url}/health").json()
        metrics = httpx.get(f"{gw.url}/metrics").text
    records = health["records"]
    assert (records["lost"], records["journaled_pending"], records["rejected"], records["written"]) == (
        lost, pending, 0, 0
    )  # fmt: skip
    assert f"prefixscope_gateway_records_lost_total {lost}.0" in metrics
    assert f"prefixscope_gateway_records_journaled_pending {pending}.0" in metrics
    assert "prefixscope_gateway_records_rejected_total 0.0" in metrics
    assert any(r.levelname == "ERROR" and "LOST" in r.getMessage() for r in caplog.records) == journal_full


@pytest.mark.postgres
def test_database_down_at_start_serves_from_snapshot_and_journal_then_replays(
    stub, stub_url, tmp_path, postgres_database
):
    from db.keys import create_api_key
    from db.migrate import upgrade

    direct_url = f"postgresql://root@127.0.0.1:5432/{postgres_database}"
    upgrade(direct_url)
    sync_engine = create_engine(direct_url.replace("postgresql://", "postgresql+psycopg://"))
    key = create_api_key(sync_engine, "acme").plaintext_key
    sync_engine.dispose()
    proxy = TcpProxy("127.0.0.1", 5432)
    proxy.start()
    proxied_url = f"postgresql://root@127.0.0.1:{proxy.port}/{postgres_database}"
    config = gateway_config(stub_url, auth="keys")
    headers = {"authorization": f"Bearer {key}"}
    try:
        with running_gateway(config, db_storage(proxied_url, tmp_path)) as gw:  # a first run saves the key snapshot
            assert httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
        assert (tmp_path / "key_snapshot.json").exists()
        proxy.stop()  # the database is down when the gateway starts again
        storage = db_storage(proxied_url, tmp_path)
        with running_gateway(config, storage) as gw:
            health = httpx.get(f"{gw.url}/health").json()
            assert health["status"] == "ok"
            assert health["database_available"] is False  # unreachable at start, before any record tried it
            for _ in range(10):
                response = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=headers)
                assert response.status_code == 200
            assert httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT).status_code == 401
            assert wait_until(lambda: storage.sink.counters().spilled == 11)
            assert count_rows(direct_url) == 1
            proxy.start()  # the database is back: migrations are retried, then the spill file is replayed
            assert wait_until(lambda: storage.sink.counters().replayed == 11, timeout_s=60)
            assert wait_until(lambda: storage.migrated)  # the background migration retry got through too
        assert count_rows(direct_url) == 12
        assert storage.sink.counters().lost == 0
    finally:
        proxy.close()


def _journaled_ids(directory: Path) -> set[str]:
    """The request ids of the complete journal lines in `directory` (`db.journal`: one JSON record per line)."""
    ids = set()
    for path in directory.glob("*.journal.*"):
        for line in path.read_bytes().split(b"\n")[:-1]:
            ids.add(json.loads(line)["request_id"])
    return ids


def _start_gateway(
    tmp_path: Path, stub_url: str, port: int, durability: str, flush_interval_s: float, extra_toml: str = ""
):
    config = tmp_path / f"gateway-{flush_interval_s}.toml"
    config.write_text(
        f'[gateway]\nsecret_file = "{tmp_path / "secret"}"\n\n'
        f'[recorder]\nspill_path = "{tmp_path / "spill" / "requests.jsonl"}"\ndurability = "{durability}"\n'
        f"flush_interval_s = {flush_interval_s}\nbatch_size = 100000\n{extra_toml}"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "prefixscope", "gateway", "--open", "--config", str(config), "--port", str(port),
         "--upstream", stub_url, "--database-url", f"sqlite:///{tmp_path / 'gateway.db'}", "--log-level", "warning"],
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.parametrize(("durability", "kept"), [("spill_first", 30), ("queue_first", 0)])
def test_sigkill_loses_nothing_with_spill_first(durability, kept, stub, stub_url, tmp_path):
    """30 answered requests sit in the writer's queue (a long batch interval) when the gateway is killed. With
    spill_first they are in the journal and the next start stores them; queue_first loses its queue, as documented."""
    port = free_port()
    process = _start_gateway(tmp_path, stub_url, port, durability, flush_interval_s=3600.0)
    try:
        ids = []
        for _ in range(30):
            response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT)
            assert response.status_code == 200
            ids.append(response.headers["x-request-id"])
        if durability == "spill_first":
            # A record is journaled as its response completes: let the last one's append land before the kill. A
            # record the rule advisor holds is journaled twice (held, then completed): count request ids, not lines.
            journal = tmp_path / "spill"
            assert wait_until(lambda: len(_journaled_ids(journal)) >= 30)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    with sqlite3.connect(tmp_path / "gateway.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 0
    process = _start_gateway(tmp_path, stub_url, port, durability, flush_interval_s=0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) in (0, -signal.SIGTERM)
    with sqlite3.connect(tmp_path / "gateway.db") as conn:
        stored = [row[0] for row in conn.execute("SELECT id FROM requests")]
    assert len(stored) == kept
    assert set(stored) <= set(ids)


ADVICE_ON = "\n[tenant_defaults]\nadvice_sample_rate = 1.0\nuplift_sample_rate = 1.0\n"
VOLATILE_CHAT = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Current time: 2025-06-01T10:00:00Z\nYou are the assistant of a bicycle shop."},
        {"role": "user", "content": "hi"},
    ],
}


@pytest.fixture
def unanswered_dry_runs(stub):
    """The stub's dry-run matches wait (until the test ends)."""
    stub.state.match_waits = True
    yield stub
    stub.state.match_waits = False


# The samples one tenant may have queued or running (`gateway.advisor.sampler`: three quarters of the queue).
HELD = DEFAULT_MAX_PENDING * 3 // 4


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_records_held_for_rule_advice_survive_the_gateway(stop, unanswered_dry_runs, stub_url, tmp_path):
    """Advice is on and the dry runs it asks for never answer, so every sampled request's record is held by the rule
    advisor (one waits for its dry runs, the rest for the worker); one tenant is sampled up to its share of the
    advisor's queue (`HELD`), the requests after that are stored at once. SIGKILL: the held records are in the
    journal and the next start stores every one, each counted once as replayed. SIGTERM: the gateway stops in bounded
    time and stores them all itself, without their estimates."""
    stub = unanswered_dry_runs
    port = free_port()
    process = _start_gateway(tmp_path, stub_url, port, "spill_first", flush_interval_s=0.05, extra_toml=ADVICE_ON)
    url = f"http://127.0.0.1:{port}"
    try:
        ids = []
        for _ in range(HELD):
            response = httpx.post(f"{url}/v1/chat/completions", json=VOLATILE_CHAT)
            assert response.status_code == 200
            ids.append(response.headers["x-request-id"])
        health = httpx.get(f"{url}/health").json()
        assert health["rule_advice"]["pending"] == HELD
        assert (health["records"]["held"], health["records"]["accepted"]) == (HELD, 0)
        assert stub.state.match_requests, "the advisor is waiting for a dry run"
        process.send_signal(stop)
        assert process.wait(timeout=60) in (0, -stop)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    with sqlite3.connect(tmp_path / "gateway.db") as conn:
        before = [row[0] for row in conn.execute("SELECT id FROM requests")]
    if stop == signal.SIGTERM:
        assert sorted(before) == sorted(ids)  # submitted (without estimates) on the way out
        assert list((tmp_path / "spill").glob("*.journal.*")) == []
        return
    assert before == []  # held only: nothing reached the database before the kill
    process = _start_gateway(tmp_path, stub_url, port, "spill_first", flush_interval_s=0.05, extra_toml=ADVICE_ON)
    try:
        assert wait_until(lambda: httpx.get(f"{url}/health").json()["records"]["replayed"] == HELD)
        records = httpx.get(f"{url}/health").json()["records"]
        metrics = httpx.get(f"{url}/metrics").text
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) in (0, -signal.SIGTERM)
    assert (records["replayed"], records["written"], records["lost"], records["rejected"], records["held"]) == (
        HELD, 0, 0, 0, 0
    )  # fmt: skip
    assert "prefixscope_gateway_records_held 0.0" in metrics
    with sqlite3.connect(tmp_path / "gateway.db") as conn:
        stored = [row[0] for row in conn.execute("SELECT id FROM requests")]
    assert sorted(stored) == sorted(ids)  # every answered request, once
