"""How to type the `prefixscope` command from here: the words a message tells a user to run.

After `make up` the command lives in the clone's virtual environment (`.venv/bin/prefixscope`), which is on nobody's
PATH until it is activated. A message that says `prefixscope keys create` would then answer `command not found`, so
messages name the command as it can be typed in the current directory: `prefixscope` when that name on PATH is this
very program, else its path (relative to the working directory when it lies below it).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

COMMAND = "prefixscope"


def typed_command(
    cwd: Path | None = None, environ: Mapping[str, str] | None = None, executable: str | None = None
) -> str:
    """`prefixscope`, `.venv/bin/prefixscope` or an absolute path: what to type in `cwd` to run this installation.

    The installation is the `prefixscope` script beside `executable` (the running Python, by default).
    """
    env = os.environ if environ is None else environ
    here = (cwd or Path.cwd()).resolve()
    script = Path(executable or sys.executable).parent / COMMAND
    on_path = shutil.which(COMMAND, path=env.get("PATH", ""))
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return COMMAND
    if not script.exists():
        return COMMAND
    script = script.absolute()
    return str(script.relative_to(here)) if script.is_relative_to(here) else str(script)
