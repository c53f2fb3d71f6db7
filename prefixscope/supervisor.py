"""Running a few programs as child processes that start in order and stop together (used by `prefixscope up`).

Stopping is the normal end: Ctrl-C (SIGINT, which the terminal also sends to the children) or SIGTERM stops every
child, newest first, and `supervise` returns 0 without complaint. A child that exits on its own is a failure: the
others are stopped and its exit status (or 1) is returned.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

POLL_INTERVAL_S = 0.5
# How long to wait, after seeing a child gone, for the signal that explains it (a terminal's Ctrl-C reaches the
# children and this process at once, and a child may be quicker to exit than this process is to notice).
STOP_GRACE_S = 1.0
TERMINATE_WAIT_S = 15.0


@dataclass(frozen=True)
class Program:
    """A child program: its name, command line, the URL that answers 200 once it is ready (or 503 "degraded"), the
    URL to print, and its environment."""

    name: str
    argv: list[str]
    health_url: str
    public_url: str
    env: Mapping[str, str] | None = None  # its environment (None: the one given to `supervise`)
    # One of several interchangeable replicas (say "engine"): while another of the group runs, its exit is reported
    # and the rest keep serving (the gateway routes around it); the stack stops once the last one has gone.
    replica_of: str | None = None


def _healthy(url: str) -> bool:
    """Whether the program answers 200, or 503 with a JSON `"status": "degraded"`: started, but refusing requests
    for a reason it states (a gateway with no API key yet, say), which waiting would not change."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except urllib.error.HTTPError as error:
        if error.code != 503:
            return False
        try:
            return json.loads(error.read()).get("status") == "degraded"
        except (ValueError, AttributeError, OSError):
            return False
    except OSError:
        return False


def _wait_healthy(program: Program, process: subprocess.Popen, timeout_s: float, stopping: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stopping():
        if process.poll() is not None:
            return False
        if _healthy(program.health_url):
            return True
        time.sleep(POLL_INTERVAL_S)
    return False


def _stop_all(processes: list[tuple[str, subprocess.Popen]]) -> None:
    for _, process in reversed(processes):
        if process.poll() is None:
            process.terminate()
    for _, process in reversed(processes):
        try:
            process.wait(timeout=TERMINATE_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def supervise(
    programs: list[Program],
    start_timeout_s: float,
    env: Mapping[str, str] | None = None,
    ready_message: str | None = None,
) -> int:
    """Start `programs` in order (each once the previous is healthy), then wait until a signal or a child's exit.
    `ready_message`, if given, is printed to stderr once all are healthy.

    Returns 0 after Ctrl-C or SIGTERM, otherwise 1 or the failing child's non-zero exit status.
    """
    processes: list[tuple[str, subprocess.Popen]] = []
    signalled = False

    def on_signal(*_: object) -> None:
        nonlocal signalled
        signalled = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def stopped_by_signal() -> bool:
        """Whether a signal asked us to stop, allowing it a moment to arrive."""
        deadline = time.monotonic() + STOP_GRACE_S
        while not signalled and time.monotonic() < deadline:
            time.sleep(0.05)
        return signalled

    try:
        for program in programs:
            print(f"starting {program.name} ...", flush=True)
            program_env = program.env if program.env is not None else env
            process = subprocess.Popen(program.argv, env=None if program_env is None else dict(program_env))
            processes.append((program.name, process))
            if not _wait_healthy(program, process, start_timeout_s, lambda: signalled):
                if stopped_by_signal():
                    print("stopping ...", flush=True)
                    return 0
                print(f"{program.name} did not become healthy at {program.health_url}", file=sys.stderr)
                return 1
            print(f"{program.name:<9} {program.public_url}", flush=True)
        if ready_message:
            print(ready_message, file=sys.stderr, flush=True)
        print("prefixscope is up; Ctrl-C stops everything.", flush=True)
        groups = {program.name: program.replica_of for program in programs}
        gone: set[str] = set()
        while not signalled:
            for name, process in processes:
                if name in gone or process.poll() is None or stopped_by_signal():
                    continue
                group = groups.get(name)
                if group and any(groups.get(n) == group and p.poll() is None for n, p in processes):
                    print(f"{name} exited with status {process.returncode}; the other replicas keep serving",
                          file=sys.stderr, flush=True)
                    gone.add(name)
                    continue
                print(f"{name} exited with status {process.returncode}; stopping the rest", file=sys.stderr)
                return process.returncode or 1
            time.sleep(POLL_INTERVAL_S)
        print("stopping ...", flush=True)
        return 0
    finally:
        _stop_all(processes)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
