"""Start Streamlit on the dashboard's entry script as a child process (`prefixscope dashboard`)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from dashboard.settings import DashboardSettings, settings_from_env, settings_to_env
from db.config import shown_url

APP_SCRIPT = Path(__file__).resolve().parent / "app.py"
# The directory holding the `dashboard` and `db` packages: the child must import them even from a source checkout.
PACKAGE_ROOT = APP_SCRIPT.parent.parent


def settings_from_args(args: argparse.Namespace) -> DashboardSettings:
    """Command-line options over the environment's settings."""
    from db.config import database_url_from_env

    base = settings_from_env()
    return replace(
        base,
        database_url=database_url_from_env(args.database_url),
        engine_url=args.engine.rstrip("/") if args.engine else base.engine_url,
        refresh_s=args.refresh_s if args.refresh_s is not None else base.refresh_s,
        default_prefill_tokens_per_s=(
            args.prefill_tokens_per_s if args.prefill_tokens_per_s is not None else base.default_prefill_tokens_per_s
        ),
        price_file=args.prices.resolve() if args.prices is not None else base.price_file,
    )


def streamlit_command(host: str, port: int) -> list[str]:
    """`python -m streamlit run app.py` with the server options the dashboard always wants."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_SCRIPT),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--server.runOnSave",
        "false",
        "--server.fileWatcherType",
        "none",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
        "--global.developmentMode",
        "false",
    ]


def child_environment(settings: DashboardSettings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(settings_to_env(settings))
    env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
    python_path = [str(PACKAGE_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(python_path))
    return env


def launch_dashboard(args: argparse.Namespace) -> int:
    """Run the dashboard until it exits or is interrupted; returns Streamlit's exit status."""
    try:
        settings = settings_from_args(args)
    except ValueError as exc:  # a malformed URL or setting (DatabaseConfigError, SettingsError)
        print(f"prefixscope dashboard: {exc}", file=sys.stderr)
        return 2
    for name, value in (
        ("--refresh-s", settings.refresh_s),
        ("--prefill-tokens-per-s", settings.default_prefill_tokens_per_s),
    ):
        if value <= 0:
            print(f"prefixscope dashboard: {name} must be positive", file=sys.stderr)
            return 2
    if settings.price_file is not None and not settings.price_file.is_file():
        print(f"prefixscope dashboard: price file {settings.price_file} does not exist", file=sys.stderr)
        return 2
    shown = shown_url(settings.database_url)
    print(f"prefixscope dashboard: http://{args.host}:{args.port} (database {shown})", flush=True)
    process = subprocess.Popen(streamlit_command(args.host, args.port), env=child_environment(settings))
    # Stopping `prefixscope dashboard` (Ctrl-C, or SIGTERM from a supervisor) must stop Streamlit too.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: process.terminate())
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        try:
            return process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()
