"""`prefixscope conversations` and `prefixscope conversation ID`, run in-process through `prefixscope.cli.main`."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from db.conversation_window import CONVERSATIONS_DEFAULT_SINCE
from db.engine import create_sync_engine_for
from db.store import store_records
from db.timeutil import utc_now
from prefixscope.cli import main
from tests.conversation_samples import EXPECTED, comparable, conversation_records, figures


@pytest.fixture
def url(db_url: str) -> str:
    engine = create_sync_engine_for(db_url)
    with engine.begin() as conn:
        store_records(conn, conversation_records(utc_now() - timedelta(hours=2)))
    engine.dispose()
    return db_url


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_conversations_table_and_json(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "conversations", "--database-url", url)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["CONVERSATION", "TENANT", "TURNS"]
    assert [line.split()[0] for line in lines[1:]] == ["conv-a", "conv-b", "conv-c"]
    assert "14.4%" in lines[1] and "24.0%" in lines[1]  # token and eligible hit rate, side by side
    assert "evicted 584, answer_rewritten 296, page alignment / last token 32" in lines[1]
    # An upstream that reports no cached tokens: `-`, never 0.
    cells = lines[3].split()
    assert cells[:3] == ["conv-c", "beta", "2"] and cells[6:12] == ["-", "-", "-", "-", "-", "0"]

    code, out, _ = _run(capsys, "conversations", "--tenant", "acme", "--json", "--database-url", url)
    listed = json.loads(out)
    assert [row["conversation_id"] for row in listed] == ["conv-a", "conv-b"]
    assert [figures(row) for row in listed] == [comparable(EXPECTED["conv-a"]), comparable(EXPECTED["conv-b"])]

    code, out, _ = _run(capsys, "conversations", "--since", "1h", "--database-url", url)
    assert (code, out.strip()) == (0, "no conversations in this range")


def test_one_conversation(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "conversation", "conv-a", "--database-url", url)
    assert code == 0
    head, header, *turns = out.splitlines()
    assert "4 turns" in head and "token hit 14.4%, eligible hit 24.0%" in head
    assert header.startswith("TURN")
    assert len(turns) == 4
    assert "answer_rewritten @ messages[2]+25" in turns[2] and "whitespace @ messages[2]+25" in turns[2]
    assert "400 / 300 (past TTL)" in turns[2] and "http://r2 (changed)" in turns[2]
    assert "96 (64/32/0)" in turns[2]

    code, out, _ = _run(capsys, "conversation", "conv-c", "--json", "--database-url", url)
    body = json.loads(out)
    assert body["conversation"]["tenant"] == "beta"
    assert [turn["cached_tokens"] for turn in body["turns"]] == [None, None]

    code, _, err = _run(capsys, "conversation", "conv-a", "--tenant", "beta", "--database-url", url)
    assert code == 2 and "no conversation 'conv-a' of tenant 'beta'" in err


def test_help_names_the_default_range(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["conversations", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert f"(default {CONVERSATIONS_DEFAULT_SINCE}, as GET /api/conversations)" in shown
