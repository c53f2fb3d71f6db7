"""The dashboard's CLI commands, its launcher, the benchmark, and the package's import rules."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dashboard import launch
from dashboard.settings import ENV_DATABASE_URL, ENV_ENGINE_URL, ENV_PRICE_FILE, settings_from_env
from prefixscope.cli import build_parser

PACKAGE = Path(__file__).resolve().parents[2] / "dashboard"


def test_commands_are_registered() -> None:
    parser = build_parser()
    args = parser.parse_args(["dashboard", "--port", "9999", "--engine", "http://127.0.0.1:8001/"])
    assert (args.port, args.host, args.engine) == (9999, "127.0.0.1", "http://127.0.0.1:8001/")
    assert callable(args.handler)
    bench = parser.parse_args(["bench", "dashboard", "--rows", "500"])
    assert bench.rows == 500 and callable(bench.handler)
    assert parser.parse_args(["demo-data", "--rows", "5"]).rows == 5  # registered once, by the gateway


def test_cli_module_is_cheap_to_import() -> None:
    code = (
        "import sys, dashboard.cli\n"
        "names = ('streamlit', 'sqlalchemy', 'plotly', 'pandas', 'httpx', 'db.queries')\n"
        "heavy = [m for m in names if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_launcher_passes_settings_through_the_environment(tmp_path: Path) -> None:
    prices = tmp_path / "p.toml"
    args = build_parser().parse_args(
        [
            "dashboard",
            "--port",
            "8600",
            "--database-url",
            "sqlite:///d.db",
            "--engine",
            "http://e:9/",
            "--refresh-s",
            "3",
            "--prices",
            str(prices),
        ]
    )
    settings = launch.settings_from_args(args)
    env = launch.child_environment(settings)
    assert env[ENV_DATABASE_URL] == "sqlite:///d.db" and env[ENV_ENGINE_URL] == "http://e:9"
    assert env[ENV_PRICE_FILE] == str(prices.resolve())
    assert settings_from_env(env) == settings
    assert str(launch.PACKAGE_ROOT) in env["PYTHONPATH"].split(":")
    command = launch.streamlit_command(args.host, args.port)
    assert command[1:5] == ["-m", "streamlit", "run", str(launch.APP_SCRIPT)]
    options = dict(zip(command[5::2], command[6::2], strict=True))
    assert options["--server.port"] == "8600" and options["--server.address"] == "127.0.0.1"
    assert options["--server.headless"] == "true" and options["--browser.gatherUsageStats"] == "false"


def test_missing_price_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["dashboard", "--prices", str(tmp_path / "none.toml")])
    assert args.handler(args) == 2
    assert "does not exist" in capsys.readouterr().err


def test_bench_prints_each_pages_query_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    args = build_parser().parse_args(["bench", "dashboard", "--rows", "300", "--database-url", url, "--repeats", "1"])
    code = args.handler(args)
    report = json.loads(capsys.readouterr().out)
    assert code == (0 if report["pass"] else 1)  # the exit status follows the verdict, whatever this machine's speed
    assert report["requests"] == 300
    assert set(report["pages"]) == {
        "overview", "requests", "conversations", "prefixes", "why_misses", "advice", "what_if", "replicas", "cost",
        "engine",
    }
    assert all("query_ms_median" in page for page in report["pages"].values())


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_dashboard_imports_only_db_among_the_programs() -> None:
    for path in PACKAGE.rglob("*.py"):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in {"gateway", "local_engine", "torch", "transformers"}, f"{path.name} imports {name}"


def test_pages_hold_no_sql() -> None:
    for path in (PACKAGE / "views").glob("*.py"):
        imported = _imports(path)
        assert not any(name.split(".")[0] == "sqlalchemy" for name in imported), path.name
        assert "db.queries" not in imported and "db.engine" not in imported, path.name
        source = path.read_text()
        assert not re.search(r"\bSELECT\b|(?<![\w.])(select|text)\(|\.execute\(", source), path.name


def test_modules_stay_small() -> None:
    for path in PACKAGE.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path.name


@pytest.mark.parametrize(
    "options",
    [["--database-url", "mysql://nope"], ["--refresh-s", "0"], ["--prefill-tokens-per-s", "-5"]],
)
def test_bad_options_are_refused(options: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["dashboard", *options])
    assert args.handler(args) == 2
    assert capsys.readouterr().err.startswith("prefixscope dashboard: ")
