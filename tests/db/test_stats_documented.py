"""`prefixscope stats` prints the groups, columns and lines that docs/operations.md names, and the README's quick start
names nothing the program does not print."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from db.engine import create_sync_engine_for
from db.records import UNAUTHENTICATED_TENANT
from db.store import store_records
from db.tenants import validate_tenant_name
from prefixscope.cli import main

ROOT = Path(__file__).resolve().parents[2]
GROUP_HEADERS = ("TENANT", "MODEL", "UPSTREAM")


def documented_names() -> list[str]:
    """The code spans of the `prefixscope stats` section of docs/operations.md, but commands and options."""
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page.split("### `prefixscope stats`", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    section = re.sub(r"```.*?```", "", section, flags=re.DOTALL)
    spans = re.findall(r"`([^`]+)`", section)
    return [span for span in spans if not span.startswith(("prefixscope", "--")) and span != UNAUTHENTICATED_TENANT]


@pytest.fixture
def recorded(db_url: str, make_record) -> str:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC) - timedelta(minutes=5)
    engine = create_sync_engine_for(db_url)
    try:
        with engine.begin() as conn:
            store_records(conn, [
                make_record(created_at=now, tenant="acme", cached_tokens=20, retention_class="1h"),
                make_record(created_at=now, tenant="acme", cached_tokens=0),
                # refused before a key named a tenant: no model, no upstream
                make_record(created_at=now, tenant=UNAUTHENTICATED_TENANT, model="", upstream="", status_code=401,
                            error_type="authentication_error", prompt_tokens=None, cached_tokens=None,
                            completion_tokens=None, ttft_ms=None),
            ])
    finally:
        engine.dispose()
    return db_url


@pytest.mark.parametrize("by", ["tenant", "model", "upstream"])
def test_stats_prints_every_name_the_docs_give(recorded: str, by: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "--since", "1h", "--by", by, "--database-url", recorded]) == 0
    out = capsys.readouterr().out
    names = documented_names()
    assert "(rejected)" in names and "requests by retention class:" in names and "REQ HIT" in names
    for name in names:
        if name in GROUP_HEADERS and name != by.upper():
            continue
        assert name in out, f"docs/operations.md names {name!r}; `stats --by {by}` printed:\n{out}"
    rejected = next(line for line in out.splitlines() if "(rejected)" in line)
    assert rejected.split()[3] == "1"  # its REQUESTS column
    assert UNAUTHENTICATED_TENANT not in out


def test_the_readme_names_the_stats_output_as_printed(recorded: str, capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text()
    assert "`(rejected)`" in readme and "prefixscope stats --since 1h --bucket 1m --by tenant" in readme
    assert main(["stats", "--since", "1h", "--bucket", "1m", "--by", "tenant", "--database-url", recorded]) == 0
    out = capsys.readouterr().out
    assert "(rejected)" in out and "requests by retention class: 5m 0, 1h 1, persistent 0, none 2" in out


def test_the_unauthenticated_tenant_name_is_reserved() -> None:
    with pytest.raises(ValueError, match="reserved"):
        validate_tenant_name(UNAUTHENTICATED_TENANT)


@pytest.mark.parametrize(
    "argv",
    [
        ["stats", "--since", "1h", "--by", "tenant", "--json"],
        ["stats", "--since", "1h", "--bucket", "1m", "--json"],
        ["keys", "create", "--tenant", "acme", "--json"],
        ["keys", "list", "--json"],
        ["simulate", "--since", "1h", "--capacity", "1k", "--json"],
        ["advise", "--since", "1h", "--json"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_every_json_output_is_one_document(recorded: str, argv: list[str], capsys: pytest.CaptureFixture[str]):
    """`--json` prints exactly one JSON document on standard output (human lines, if any, go to standard error)."""
    import json

    assert main([*argv, "--database-url", recorded]) == 0
    json.loads(capsys.readouterr().out)  # raises on a second document or a stray line
