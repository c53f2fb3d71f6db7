"""Where prefixscope keeps its per-user state: one directory, whatever the working directory.

The directory is `$PREFIXSCOPE_HOME` when set, else the platform's per-user data directory from `platformdirs`
(`$XDG_DATA_HOME/prefixscope`, i.e. `~/.local/share/prefixscope` on Linux). It holds:

- `prefixscope.db`: the default SQLite database (used when no database URL is given anywhere);
- `gateway_secret`: the gateway's server secret, from which tenants' cache salts are derived (0600);
- `engine_api_key`: the API key `prefixscope up` gave its engines this start, for scraping their `/metrics` (0600);
- `spill/`: records the gateway could not write to the database yet.

This module imports nothing from the programs, so every package (`gateway`, `db`, `dashboard`, `local_engine`)
may import it without breaking the one-way import rules. Nothing is created here: functions return paths, and
the program that writes a file creates its directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ENV_HOME = "PREFIXSCOPE_HOME"
APP_NAME = "prefixscope"


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The state directory: `$PREFIXSCOPE_HOME` (made absolute, `~` expanded), else the per-user data directory."""
    env = os.environ if environ is None else environ
    explicit = env.get(ENV_HOME)
    if explicit:
        return Path(explicit).expanduser().resolve()
    from platformdirs import user_data_path

    return user_data_path(APP_NAME, appauthor=False)


def default_database_path(environ: Mapping[str, str] | None = None) -> Path:
    """The default SQLite database file."""
    return state_dir(environ) / "prefixscope.db"


def default_database_url(environ: Mapping[str, str] | None = None) -> str:
    """`sqlite+aiosqlite:///<state dir>/prefixscope.db` (an absolute path, so four slashes on POSIX)."""
    return f"sqlite+aiosqlite:///{default_database_path(environ)}"


def gateway_secret_path(environ: Mapping[str, str] | None = None) -> Path:
    """The default file holding the gateway's server secret."""
    return state_dir(environ) / "gateway_secret"


def engine_api_key_path(environ: Mapping[str, str] | None = None) -> Path:
    """The file where `prefixscope up` keeps the API key of the engines it started (a bearer token)."""
    return state_dir(environ) / "engine_api_key"


def spill_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The default directory of spill files (records waiting for the database)."""
    return state_dir(environ) / "spill"
