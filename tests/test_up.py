"""`prefixscope up` without loading a model: its port checks, the command lines it builds, how it stops, and
`make up ARGS=...`. The whole stack with the real model is in test_stack.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from prefixscope.cli import build_parser
from prefixscope.ports import PortRequest, port_problems
from prefixscope.stack import plan

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_taken_port_is_named_with_the_option_that_moves_it_and_nothing_starts(tmp_path: Path) -> None:
    engine, gateway, dashboard = _free_port(), _free_port(), _free_port()
    with socket.socket() as other:  # another program already listening on the gateway's port
        other.bind(("127.0.0.1", gateway))
        other.listen()
        result = subprocess.run(
            [sys.executable, "-m", "prefixscope", "up", "--engine-port", str(engine), "--gateway-port", str(gateway),
             "--dashboard-port", str(dashboard)],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
            env={**os.environ, "PREFIXSCOPE_HOME": str(tmp_path / "home")},
        )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"prefixscope up: port {gateway} on 127.0.0.1 (the gateway) is already in use, perhaps by another "
        "prefixscope: stop that program or choose another port with --gateway-port PORT",
        "prefixscope up: nothing was started",
    ]
    assert not (tmp_path / "home").exists()


def test_the_same_port_for_two_programs_is_refused() -> None:
    port = _free_port()
    problems = port_problems(
        "127.0.0.1", [PortRequest("engine", port, "--engine-port"), PortRequest("gateway", port, "--gateway-port")]
    )
    assert problems == [
        f"port {port} is chosen for both the engine and the gateway: give one of them another with --gateway-port PORT"
    ]
    assert port_problems("127.0.0.1", [PortRequest("engine", port, "--engine-port")]) == []


def test_options_are_passed_to_each_program(tmp_path: Path) -> None:
    config = tmp_path / "prefixscope.toml"
    args = build_parser().parse_args(
        ["up", "--model", "/models/tiny", "--device", "cpu", "--kv-cache-gib", "0.5", "--page-size", "16",
         "--eviction", "fifo", "--ttl", "600", "--no-prefix-cache", "--max-num-seqs", "4",
         "--max-num-batched-tokens", "256", "--config", str(config), "--engine-port", "7001", "--gateway-port", "7080", "--dashboard-port", "7501",
         "--database-url", "sqlite:///x.db"]
    )
    programs = {program.name: program for program in plan(args)}
    python = [sys.executable, "-m", "prefixscope"]
    assert programs["engine"].argv == python + [
        "engine", "--model", "/models/tiny", "--device", "cpu", "--kv-cache-gib", "0.5", "--page-size", "16",
        "--eviction", "fifo", "--ttl", "600.0", "--no-prefix-cache", "--max-num-seqs", "4",
        "--max-num-batched-tokens", "256", "--host", "127.0.0.1", "--port", "7001",
    ]
    assert programs["gateway"].argv == python + [
        "gateway", "--host", "127.0.0.1", "--port", "7080", "--upstream", "http://127.0.0.1:7001",
        "--config", str(config), "--database-url", "sqlite:///x.db",
    ]
    assert programs["dashboard"].argv == python + [
        "dashboard", "--host", "127.0.0.1", "--port", "7501", "--engine", "http://127.0.0.1:7001",
        "--database-url", "sqlite:///x.db",
    ]
    assert [programs[name].health_url for name in ("engine", "gateway", "dashboard")] == [
        "http://127.0.0.1:7001/health", "http://127.0.0.1:7080/health", "http://127.0.0.1:7501/_stcore/health"
    ]
    defaults = {p.name: p for p in plan(build_parser().parse_args(["up"]))}
    assert defaults["engine"].argv == python + ["engine", "--host", "127.0.0.1", "--port", "8001"]


def test_help_documents_the_port_options() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "prefixscope", "up", "--help"], capture_output=True, text=True, check=True
    )
    for option in ("--engine-port", "--gateway-port", "--dashboard-port", "--config", "--kv-cache-tokens", "--model"):
        assert option in result.stdout


def test_a_missing_config_file_is_refused_before_anything_starts(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "prefixscope", "up", "--config", str(tmp_path / "nope.toml")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == f"prefixscope up: no config file at {tmp_path / 'nope.toml'}"


# Two small HTTP servers stand in for the programs; the second exits by itself after `LIFETIME` seconds when asked.
SUPERVISED = textwrap.dedent(
    """
    import sys
    from prefixscope.supervisor import Program, supervise

    def server(port, lifetime):
        code = (
            "import http.server, os, sys, threading\\n"
            "class Quiet(http.server.SimpleHTTPRequestHandler):\\n    def log_message(self, *args): pass\\n"
            f"server = http.server.HTTPServer(('127.0.0.1', {port}), Quiet)\\n"
            + (f"threading.Timer({lifetime}, lambda: os._exit(3)).start()\\n" if lifetime else "")
            + "try:\\n    server.serve_forever()\\nexcept KeyboardInterrupt:\\n    sys.exit(0)\\n"
        )
        group = "server" if sys.argv[4:] == ["replicas"] else None
        return Program(f"server{port}", [sys.executable, "-c", code], f"http://127.0.0.1:{port}/", "", replica_of=group)

    first, second, lifetime = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    sys.exit(supervise([server(first, 0), server(second, lifetime)], start_timeout_s=60))
    """
)


def _supervise(tmp_path: Path, lifetime: float, *extra: str) -> tuple[subprocess.Popen, list[int]]:
    ports = [_free_port(), _free_port()]
    process = subprocess.Popen(
        [sys.executable, "-c", SUPERVISED, *map(str, ports), str(lifetime), *extra],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("prefixscope is up"):
            return process, ports
    pytest.fail(f"the supervisor did not start its programs: {process.communicate()}")


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_ctrl_c_stops_everything_with_status_0_and_no_alarm(tmp_path: Path) -> None:
    process, ports = _supervise(tmp_path, lifetime=0)
    # A terminal's Ctrl-C: SIGINT to the whole process group, the children included.
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0
    assert "stopping the rest" not in err and "Traceback" not in err
    assert out.strip().splitlines()[-1] == "stopping ..."
    assert not any(_listening(port) for port in ports)


def test_sigterm_stops_everything_with_status_0(tmp_path: Path) -> None:
    process, ports = _supervise(tmp_path, lifetime=0)
    process.send_signal(signal.SIGTERM)  # to the supervisor only: it stops its children
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0 and err == ""
    assert not any(_listening(port) for port in ports)


def test_a_child_that_dies_stops_the_rest_and_fails(tmp_path: Path) -> None:
    process, ports = _supervise(tmp_path, lifetime=3)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 3
    assert err.strip() == f"server{ports[1]} exited with status 3; stopping the rest"
    deadline = time.monotonic() + 10
    while _listening(ports[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _listening(ports[0])


def test_a_replica_that_dies_leaves_the_others_serving(tmp_path: Path) -> None:
    process, ports = _supervise(tmp_path, 3, "replicas")
    assert process.stderr is not None
    line = process.stderr.readline()  # blocks until the second replica has exited and been reported
    assert line.strip() == f"server{ports[1]} exited with status 3; the other replicas keep serving"
    assert process.poll() is None and _listening(ports[0])
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 0 and not _listening(ports[0])


def test_make_up_forwards_args() -> None:
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "-W", "pyproject.toml", "up", "ARGS=--gateway-port 9080 --config my.toml",
         "VENV=/nonexistent"],
        cwd=ROOT, capture_output=True, text=True, check=True,
        # Run from inside `make test` (as CI does), a nested make would also print its directory changes.
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")},
    )
    assert result.stdout.strip().splitlines()[-1] == "/nonexistent/bin/prefixscope up --gateway-port 9080 --config my.toml"


def test_the_readme_works_from_a_clone() -> None:
    import re

    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)\)", readme)
    assert "docs/ARCHITECTURE.md" in links
    assert all((ROOT / link).exists() for link in links if "://" not in link), links
    assert "../shared" not in readme
    for documented in ("--engine-port", "--gateway-port", "--dashboard-port", "ARGS="):
        assert documented in readme
    operations = (ROOT / "docs" / "operations.md").read_text()
    for documented in ("--engine-port", "--gateway-port", "--dashboard-port", "ARGS=", "PREFIXSCOPE_HOME"):
        assert documented in operations
    for page in (ROOT / "docs").glob("*.md"):
        targets = re.findall(r"\]\(([^)#]+)\)", page.read_text())
        assert all((page.parent / t).exists() for t in targets if "://" not in t), (page.name, targets)


def test_the_config_file_database_is_the_one_every_program_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `database_url` in the gateway's config reaches the dashboard too (and is the one `up` prints), so the
    dashboard shows what the gateway records; the environment still wins over the file, as in the gateway."""
    from prefixscope.stack import _print_state, prepare

    monkeypatch.delenv("PREFIXSCOPE_DATABASE_URL", raising=False)
    monkeypatch.setenv("PREFIXSCOPE_HOME", str(tmp_path / "home"))
    config = tmp_path / "team.toml"
    config.write_text('[gateway]\ndatabase_url = "sqlite:////srv/team.db"\n')
    args = build_parser().parse_args(["up", "--config", str(config)])
    assert prepare(args) == 0
    programs = {program.name: program for program in plan(args)}
    for name in ("gateway", "dashboard"):
        assert programs[name].argv[-2:] == ["--database-url", "sqlite:////srv/team.db"], name
    _print_state(args)
    assert "database  sqlite:////srv/team.db" in capsys.readouterr().out

    monkeypatch.setenv("PREFIXSCOPE_DATABASE_URL", "sqlite:////srv/env.db")
    args = build_parser().parse_args(["up", "--config", str(config)])
    assert prepare(args) == 0
    assert "--database-url" not in {p.name: p for p in plan(args)}["dashboard"].argv


def test_a_config_file_in_the_working_directory_is_used_and_shown_as_the_gateway_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefixscope.stack import _print_state, prepare

    monkeypatch.delenv("PREFIXSCOPE_DATABASE_URL", raising=False)
    monkeypatch.setenv("PREFIXSCOPE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prefixscope.toml").write_text('[gateway]\ndatabase_url = "sqlite:///here.db"\n')
    args = build_parser().parse_args(["up"])
    assert prepare(args) == 0
    programs = {program.name: program for program in plan(args)}
    assert programs["dashboard"].argv[-2:] == ["--database-url", "sqlite:///here.db"]
    _print_state(args)
    assert f"config    {tmp_path / 'prefixscope.toml'}" in capsys.readouterr().out


def test_a_bad_config_file_is_refused_before_the_engine_loads(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[gateway]\nport = \n")
    result = subprocess.run(
        [sys.executable, "-m", "prefixscope", "up", "--config", str(config), "--engine-port", str(_free_port()),
         "--gateway-port", str(_free_port()), "--dashboard-port", str(_free_port())],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PREFIXSCOPE_HOME": str(tmp_path / "home")},
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"prefixscope up: cannot read config {config}")


def test_ctrl_c_while_a_program_starts_ends_quietly(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the children too, often while one is still importing: no traceback."""
    code = (
        "import db.commands as commands\n"
        "def interrupted(args):\n    raise KeyboardInterrupt\n"
        "commands.stats = interrupted\n"
        "from prefixscope.cli import main\n"
        "raise SystemExit(main(['stats']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 130
    assert result.stderr == "" and result.stdout == ""


def test_a_database_password_is_never_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`up` and `dashboard` print the database they use at start-up, without its password (as the gateway does)."""
    import dashboard.launch
    from prefixscope.stack import _print_state

    url = "postgresql+asyncpg://prefixscope:s3cret-pw@db.internal:5432/prefixscope"
    _print_state(build_parser().parse_args(["up", "--database-url", url]))

    class Streamlit:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(dashboard.launch.subprocess, "Popen", Streamlit)
    monkeypatch.setattr(dashboard.launch.signal, "signal", lambda *args: None)
    assert dashboard.launch.launch_dashboard(build_parser().parse_args(["dashboard", "--database-url", url])) == 0
    out = capsys.readouterr().out
    assert "s3cret-pw" not in out
    assert out.count("postgresql+asyncpg://***@db.internal:5432/prefixscope") == 2


@pytest.mark.parametrize("port", ["0", "70000", "-1"])
def test_a_port_out_of_range_is_refused_by_the_parser(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    for option in ("--engine-port", "--gateway-port", "--dashboard-port"):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(["up", option, port])
        assert exited.value.code == 2
        assert f"argument {option}: {port} is not a port number (1-65535)" in capsys.readouterr().err


def test_an_ipv6_address_makes_valid_urls() -> None:
    programs = {p.name: p for p in plan(build_parser().parse_args(["up", "--host", "::1"]))}
    assert programs["engine"].health_url == "http://[::1]:8001/health"
    assert programs["engine"].argv[-4:] == ["--host", "::1", "--port", "8001"]
    assert programs["gateway"].argv[-2:] == ["--upstream", "http://[::1]:8001"]
    assert programs["gateway"].public_url == "http://[::1]:8080/v1"
    assert programs["dashboard"].argv[-2:] == ["--engine", "http://[::1]:8001"]
    assert programs["dashboard"].health_url == "http://[::1]:8501/_stcore/health"


def test_replicas_get_their_own_disk_cache_directories(tmp_path: Path) -> None:
    """An engine locks its disk directory, so replicas sharing one would refuse to start."""
    args = build_parser().parse_args(["up", "--replicas", "2", "--disk-cache-dir", str(tmp_path / "kv")])
    programs = {program.name: program for program in plan(args)}
    dirs = [p.argv[p.argv.index("--disk-cache-dir") + 1] for name, p in sorted(programs.items())
            if name.startswith("engine")]
    assert dirs == [str(tmp_path / "kv" / "replica-1"), str(tmp_path / "kv" / "replica-2")]
    single = plan(build_parser().parse_args(["up", "--disk-cache-dir", str(tmp_path / "kv")]))
    engine = next(p for p in single if p.name == "engine")
    assert engine.argv[engine.argv.index("--disk-cache-dir") + 1] == str(tmp_path / "kv")
