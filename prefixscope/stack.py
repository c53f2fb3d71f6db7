"""`prefixscope up`: start the engine, then the gateway in front of it, then the dashboard, as child processes.

Each program runs in its own process (the gateway must never share a process with torch), started in dependency
order and stopped together: Ctrl-C, SIGTERM or any child exiting stops the rest. The engine gets a freshly generated
API key and admin token, handed to the gateway (its upstream key) and the dashboard (the cache views) through their
environments, so nothing reaches the engine around the gateway. The gateway requires API keys unless `--open`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request


def _wait_healthy(url: str, process: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def _program_available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _plan(args: argparse.Namespace) -> list[tuple[str, list[str], str, str]]:
    """(name, argv, health URL, URL to print) for each program to start, in order."""
    command = [sys.executable, "-m", "prefixscope"]
    database = ["--database-url", args.database_url] if args.database_url else []
    host = args.host
    engine_url = f"http://{host}:{args.engine_port}"
    engine_argv = command + ["engine", "--model", args.model, "--device", args.device, "--host", host,
                             "--port", str(args.engine_port)]
    if args.kv_cache_tokens:
        engine_argv += ["--kv-cache-tokens", str(args.kv_cache_tokens)]
    plan = [("engine", engine_argv, engine_url + "/health", engine_url + "/v1")]
    if _program_available("gateway.cli"):
        gateway_url = f"http://{host}:{args.gateway_port}"
        argv = command + ["gateway", "--host", host, "--port", str(args.gateway_port), "--upstream", engine_url]
        argv += ["--open"] if args.open else []
        plan.append(("gateway", argv + database, gateway_url + "/health", gateway_url + "/v1"))
    if _program_available("dashboard.cli"):
        dashboard_url = f"http://{host}:{args.dashboard_port}"
        argv = command + ["dashboard", "--host", host, "--port", str(args.dashboard_port), "--engine", engine_url]
        plan.append(("dashboard", argv + database, dashboard_url + "/_stcore/health", dashboard_url))
    return plan


OPEN_BANNER = """
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!!  OPEN MODE (--open): the gateway checks no API key. Anyone who can reach it is tenant "default" with admin  !!
!!  rights. Leave out --open and create keys with `prefixscope keys create --tenant NAME` instead.             !!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
"""


def shared_secrets_env(environ: dict[str, str]) -> dict[str, str]:
    """`environ` plus a generated engine API key and admin token, wired to the engine, the gateway's upstream and
    the dashboard (values already set in `environ` are kept)."""
    api_key = environ.get("PREFIXSCOPE_ENGINE_API_KEY") or secrets.token_urlsafe(32)
    admin_token = environ.get("PREFIXSCOPE_ENGINE_ADMIN_TOKEN") or secrets.token_urlsafe(32)
    return {
        **environ,
        "PREFIXSCOPE_ENGINE_API_KEY": api_key,
        "PREFIXSCOPE_ENGINE_ADMIN_TOKEN": admin_token,
        "PREFIXSCOPE_UPSTREAM_API_KEY": api_key,
        "PREFIXSCOPE_DASHBOARD_ENGINE_TOKEN": admin_token,
    }


def _up(args: argparse.Namespace) -> int:
    processes: list[tuple[str, subprocess.Popen]] = []
    stopping = False
    env = shared_secrets_env(dict(os.environ))
    if args.open:
        print(OPEN_BANNER, file=sys.stderr, flush=True)

    def stop(*_) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        for name, argv, health_url, public_url in _plan(args):
            print(f"starting {name} ...", flush=True)
            process = subprocess.Popen(argv, env=env)
            processes.append((name, process))
            if not _wait_healthy(health_url, process, args.start_timeout):
                print(f"{name} did not become healthy at {health_url}", file=sys.stderr)
                return 1
            print(f"{name:<9} {public_url}", flush=True)
        if args.open:
            print(OPEN_BANNER, file=sys.stderr, flush=True)
        else:
            print("the gateway requires API keys: prefixscope keys create --tenant NAME", flush=True)
        print("prefixscope is up; Ctrl-C stops everything.", flush=True)
        while not stopping:
            for name, process in processes:
                if process.poll() is not None:
                    print(f"{name} exited with status {process.returncode}; stopping the rest", file=sys.stderr)
                    return process.returncode or 1
            time.sleep(0.5)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        for _, process in reversed(processes):
            if process.poll() is None:
                process.terminate()
        for _, process in reversed(processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


def register(commands, bench_commands) -> None:
    up = commands.add_parser("up", help="start the engine, gateway and dashboard together")
    up.add_argument("--model", default="smollm2")
    up.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    up.add_argument("--kv-cache-tokens", type=int, default=None)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--engine-port", type=int, default=8001)
    up.add_argument("--gateway-port", type=int, default=8080)
    up.add_argument("--dashboard-port", type=int, default=8501)
    up.add_argument("--database-url", default=None, help="default: PREFIXSCOPE_DATABASE_URL, then local SQLite")
    up.add_argument("--start-timeout", type=float, default=180.0, help="seconds to wait for each program")
    up.add_argument(
        "--open", action="store_true", help='run the gateway without API keys (everyone is tenant "default"; loud)'
    )
    up.set_defaults(handler=_up)
