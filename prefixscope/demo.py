"""Demo history for programs that may not import the gateway (`db`, `dashboard`): runs `prefixscope demo-data`.

The generator lives with the gateway (`gateway.demo`), whose request path makes the records; imports point one way
(gateway -> db, dashboard -> db), so other programs reach it through the command line, in a child process.
"""

from __future__ import annotations

import subprocess
import sys


class DemoDataError(RuntimeError):
    """`prefixscope demo-data` failed; the message is its error output."""


def write_demo_data(url: str, rows: int, seed: int = 0, days: int = 14, chain_share: float | None = None) -> str:
    """Run `prefixscope demo-data` on the database at `url` and return its summary line.

    Its progress goes to this process's standard error as it runs. Raises `DemoDataError` when it fails.
    """
    command = [sys.executable, "-m", "prefixscope", "demo-data", "--database-url", url, "--rows", str(rows),
               "--seed", str(seed), "--days", str(days)]
    if chain_share is not None:
        command += ["--chain-share", str(chain_share)]
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise DemoDataError(f"prefixscope demo-data exited with status {result.returncode}")
    return result.stdout.strip()
