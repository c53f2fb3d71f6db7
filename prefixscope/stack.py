"""`prefixscope up`: start the engine, then the gateway in front of it, then the dashboard, as child processes.

Each program runs in its own process (the gateway must never share a process with torch), started in dependency
order and stopped together: Ctrl-C, SIGTERM or any child exiting stops the rest.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
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
    plan, engine_urls = [], []
    num_replicas = max(1, getattr(args, "replicas", 1))
    for replica in range(num_replicas):  # replicas take consecutive ports, each with its own KV pool
        port = args.engine_port + replica
        engine_url = f"http://{host}:{port}"
        engine_argv = command + ["engine", "--model", args.model, "--device", args.device, "--host", host,
                                 "--port", str(port)]
        if args.kv_cache_tokens:
            engine_argv += ["--kv-cache-tokens", str(args.kv_cache_tokens)]
        name = "engine" if num_replicas == 1 else f"engine{replica + 1}"
        plan.append((name, engine_argv, engine_url + "/health", engine_url + "/v1"))
        engine_urls.append(engine_url)
    engine_url = engine_urls[0]
    if _program_available("gateway.cli"):
        gateway_url = f"http://{host}:{args.gateway_port}"
        argv = command + ["gateway", "--host", host, "--port", str(args.gateway_port)]
        for url in engine_urls:
            argv += ["--upstream", url]
        plan.append(("gateway", argv + database, gateway_url + "/health", gateway_url + "/v1"))
    if _program_available("dashboard.cli"):
        dashboard_url = f"http://{host}:{args.dashboard_port}"
        argv = command + ["dashboard", "--host", host, "--port", str(args.dashboard_port), "--engine", engine_url]
        plan.append(("dashboard", argv + database, dashboard_url + "/_stcore/health", dashboard_url))
    return plan


def _up(args: argparse.Namespace) -> int:
    processes: list[tuple[str, subprocess.Popen]] = []
    stopping = False

    def stop(*_) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        for name, argv, health_url, public_url in _plan(args):
            print(f"starting {name} ...", flush=True)
            process = subprocess.Popen(argv, env=os.environ.copy())
            processes.append((name, process))
            if not _wait_healthy(health_url, process, args.start_timeout):
                print(f"{name} did not become healthy at {health_url}", file=sys.stderr)
                return 1
            print(f"{name:<9} {public_url}", flush=True)
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
    up.add_argument("--kv-cache-tokens", type=int, default=None, help="KV pool of each engine (tokens)")
    up.add_argument(
        "--replicas", type=int, default=1, help="engines to start (ports from --engine-port up), routed cache-aware"
    )
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--engine-port", type=int, default=8001)
    up.add_argument("--gateway-port", type=int, default=8080)
    up.add_argument("--dashboard-port", type=int, default=8501)
    up.add_argument("--database-url", default=None, help="default: PREFIXSCOPE_DATABASE_URL, then local SQLite")
    up.add_argument("--start-timeout", type=float, default=180.0, help="seconds to wait for each program")
    up.set_defaults(handler=_up)
