"""The CLI registration, cheap imports, and the import direction (the gateway never loads the engine)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from prefixscope.cli import build_parser

GATEWAY_DIR = Path(__file__).resolve().parents[2] / "gateway"
FORBIDDEN = {"torch", "transformers", "local_engine", "dashboard", "streamlit"}


def test_gateway_commands_are_registered():
    parser = build_parser()
    args = parser.parse_args(
        ["gateway", "--port", "9999", "--upstream", "http://127.0.0.1:1", "--database-url", "sqlite:///x.db"]
    )
    assert (args.port, args.upstream, args.database_url) == (9999, ["http://127.0.0.1:1"], "sqlite:///x.db")
    assert callable(args.handler)
    bench = parser.parse_args(["bench", "gateway", "--duration", "1"])
    assert bench.duration == 1 and callable(bench.handler)


def test_cli_module_is_cheap_to_import():
    code = "import gateway.cli, sys; print(sorted({'litestar', 'httpx', 'sqlalchemy', 'torch'} & set(sys.modules)))"
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert output == "[]"


def test_gateway_never_imports_the_engine_or_torch():
    offenders = []
    for path in GATEWAY_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_modules_stay_small():
    sizes = {path.name: len(path.read_text().splitlines()) for path in GATEWAY_DIR.rglob("*.py")}
    assert max(sizes.values()) <= 400, sizes


def test_bad_config_exits_with_an_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[gateway]\nport = 'x'\nnope = 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "prefixscope", "gateway", "--config", str(bad)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "prefixscope gateway:" in result.stderr


def test_a_state_directory_that_cannot_hold_the_secret_exits_with_one_line(tmp_path):
    import os
    import socket

    taken = tmp_path / "a-file"
    taken.write_text("not a directory\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-m", "prefixscope", "gateway", "--port", str(port), "--log-level", "warning"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PREFIXSCOPE_HOME": str(taken), "PREFIXSCOPE_DATABASE_URL": ""},
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"prefixscope gateway: cannot read the server secret file {taken / 'gateway_secret'}: "
        f"[Errno 20] Not a directory: '{taken / 'gateway_secret'}'"
    )


def test_prefixscope_gateway_command_serves_and_records(tmp_path, stub, stub_url):
    """The real command line: start, serve one request, stop with SIGTERM, find the row."""
    import signal
    import sqlite3
    import time

    import httpx
    from gateway_testkit import free_port

    import os

    port = free_port()
    database = tmp_path / "cli.db"
    home = tmp_path / "home"
    log = tmp_path / "gateway.log"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefixscope",
            "gateway",
            "--port",
            str(port),
            "--upstream",
            stub_url,
            "--database-url",
            f"sqlite:///{database}",
            "--log-level",
            "info",
            "--open",
        ],
        cwd=tmp_path,
        env={**os.environ, "PREFIXSCOPE_HOME": str(home)},  # the secret file and spill file live in the state dir
        stderr=log.open("w"),
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert response.status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal (exit status -SIGTERM).
        assert process.wait(timeout=60) in (0, -signal.SIGTERM)
    with sqlite3.connect(database) as conn:
        assert conn.execute("SELECT id FROM requests").fetchall() == [(response.headers["x-request-id"],)]
    secret = home / "gateway_secret"
    assert secret.exists() and (secret.stat().st_mode & 0o777) == 0o600
    assert not (tmp_path / "var").exists()
    printed = log.read_text()
    assert f"prefixscope gateway: secret    {secret}\n" in printed
    assert f"prefixscope gateway: spill     {home / 'spill' / 'gateway_requests.jsonl'}\n" in printed
    assert f"prefixscope gateway: database  sqlite:///{database}\n" in printed
    # The upstream call was made, but httpx's per-request INFO line and Alembic's plugin and dialect lines are not logged.
    assert "HTTP Request:" not in printed and "setup plugin" not in printed
    assert "Context impl" not in printed and "Will assume" not in printed
