"""The programs a benchmark starts (engines, a gateway) as child processes: a free port, start with a log file,
wait for `/health`, stop."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(command: list[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `command` with its output appended to `log`."""
    with open(log, "ab") as handle:
        return subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT,
                                env=None if env is None else dict(env))


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float = 600.0) -> None:
    """Return once `url/health` answers 200; RuntimeError when the process exits or `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not become healthy")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 30 seconds."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
