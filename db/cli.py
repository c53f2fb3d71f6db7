"""The database's subcommands of `prefixscope`: `db ...`, `keys ...`, `stats`, `demo-data`, `bench db-queries`.

Cheap to import: only argparse here. Each handler imports `db.commands` (and with it SQLAlchemy) when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

Handler = Callable[[argparse.Namespace], int]


def _lazy(name: str) -> Handler:
    """A handler that imports `db.commands` on first use and calls the function called `name`."""

    def handler(args: argparse.Namespace) -> int:
        from db import commands

        result: int = getattr(commands, name)(args)
        return result

    handler.__name__ = name
    return handler


def _with_url(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--database-url",
        default=None,
        help="database URL (default: $PREFIXSCOPE_DATABASE_URL, else sqlite+aiosqlite:///./prefixscope.db)",
    )
    return parser


def add_demo_data_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of the demo-data command, for any program that wants to expose it under its own name."""
    _with_url(parser)
    parser.add_argument("--rows", type=int, default=100_000, help="requests to generate (default 100000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives the same rows")
    parser.add_argument("--days", type=int, default=14, help="spread the requests over this many days before now")
    parser.set_defaults(handler=run_demo_data)
    return parser


run_demo_data: Handler = _lazy("demo_data")


def _register_db(commands: Any) -> None:
    db_parser = commands.add_parser("db", help="database schema and maintenance")
    db_commands = db_parser.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = _with_url(db_commands.add_parser("upgrade", help="migrate the schema up (creates it if new)"))
    upgrade.add_argument("--revision", default="head", help="target revision (default: head)")
    upgrade.set_defaults(handler=_lazy("db_upgrade"))
    downgrade = _with_url(db_commands.add_parser("downgrade", help="migrate the schema down"))
    downgrade.add_argument("revision", help="target revision ('base' drops every table)")
    downgrade.set_defaults(handler=_lazy("db_downgrade"))
    current = _with_url(db_commands.add_parser("current", help="print the schema revision"))
    current.set_defaults(handler=_lazy("db_current"))
    rebuild = _with_url(db_commands.add_parser("rebuild-rollups", help="recompute the hourly rollups from requests"))
    rebuild.set_defaults(handler=_lazy("db_rebuild_rollups"))
    add_demo_data_arguments(db_commands.add_parser("demo-data", help="write realistic demo request history"))


def _register_keys(commands: Any) -> None:
    keys_parser = commands.add_parser("keys", help="API keys of tenants")
    keys_commands = keys_parser.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = _with_url(keys_commands.add_parser("create", help="create a key (printed once, stored hashed)"))
    create.add_argument("--tenant", required=True, help="tenant name (created if new)")
    create.add_argument("--admin", action="store_true", help="the key may use admin endpoints")
    create.add_argument("--label", default=None, help="a note to recognise the key by")
    create.add_argument("--json", action="store_true", help="print JSON")
    create.set_defaults(handler=_lazy("keys_create"))
    revoke = _with_url(keys_commands.add_parser("revoke", help="revoke a key"))
    revoke.add_argument("key_id", help="the key's public id (the part after 'psk-')")
    revoke.set_defaults(handler=_lazy("keys_revoke"))
    listing = _with_url(keys_commands.add_parser("list", help="list keys (no secrets)"))
    listing.add_argument("--active", action="store_true", help="leave out revoked keys")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=_lazy("keys_list"))


def _register_stats(commands: Any) -> None:
    stats = _with_url(commands.add_parser("stats", help="prompt-cache figures over time, from the rollups"))
    stats.add_argument("--since", default="7d", help="start: a duration before now (7d, 12h) or ISO time")
    stats.add_argument("--until", default=None, help="end (exclusive): a duration before now or ISO time")
    stats.add_argument("--bucket", default="1h", help="bucket size: 1h, 2h, 3h, 4h, 6h, 8h, 12h, 1d or 1w")
    stats.add_argument("--by", choices=("tenant", "model", "upstream"), default=None, help="one row per group")
    stats.add_argument("--tenant", default=None, help="only this tenant")
    stats.add_argument("--model", default=None, help="only this model")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(handler=_lazy("stats"))


def register(commands: Any, bench_commands: Any) -> None:
    """Add the database's commands to the `prefixscope` parser (see `prefixscope.cli`)."""
    _register_db(commands)
    _register_keys(commands)
    _register_stats(commands)
    # Also at top level, as `prefixscope demo-data`; guarded so that a program registering the same name first wins.
    if "demo-data" not in commands.choices:
        add_demo_data_arguments(commands.add_parser("demo-data", help="write realistic demo request history"))
    bench = bench_commands.add_parser("db-queries", help="time the read-side queries on demo data")
    bench.add_argument("--database-url", default=None, help="database to time (default: a temporary SQLite file)")
    bench.add_argument("--rows", type=int, default=200_000, help="demo rows to generate first when the DB is empty")
    bench.add_argument("--repeat", type=int, default=3, help="runs per query (the best is printed)")
    bench.set_defaults(handler=_lazy("bench_queries"))
