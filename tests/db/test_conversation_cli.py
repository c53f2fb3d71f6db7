"""`prefixscope conversations` and `prefixscope conversation ID`, run in-process through `prefixscope.cli.main`."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from db.conversation_window import CONVERSATIONS_DEFAULT_SINCE, CONVERSATIONS_MAX_LIMIT
from db.engine import create_sync_engine_for
from db.query_params import QueryParamError, row_limit, time_range
from db.queries.results_conversations import short_request_id
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
    assert ": 4 turns, " in head and "token hit 14.4%, eligible hit 24.0%" in head
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


def _cells(header: str, line: str) -> dict[str, str]:
    """A table row as {column: cell}, cut where the header's columns start (cells may hold spaces)."""
    names = [name for name in header.split("  ") if name]
    starts = [header.index(name) for name in names]
    ends = [*starts[1:], None]
    return {name.strip(): line[start:end].strip() for name, start, end in zip(names, starts, ends, strict=True)}


def test_turns_show_their_parent_and_a_known_zero_loss(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """LOST is `0` for a ledger that lost nothing and `-` only without a ledger; PARENT tells two turns of the same
    index apart (a retry or a fork) by the parent's short request id."""
    code, out, _ = _run(capsys, "conversation", "conv-a", "--json", "--database-url", url)
    ids = [turn["request_id"] for turn in json.loads(out)["turns"]]
    code, out, _ = _run(capsys, "conversation", "conv-a", "--database-url", url)
    _, header, *lines = out.splitlines()
    rows = [_cells(header, line) for line in lines]
    assert [row["PARENT"] for row in rows] == ["-", *(short_request_id(i) for i in ids[:-1])]
    assert [row["REQUEST"] for row in rows] == [short_request_id(i) for i in ids]
    assert rows[0]["LOST"] == "0" and rows[3]["LOST"] == "evicted 584, page alignment / last token 16"
    code, out, _ = _run(capsys, "conversation", "conv-c", "--database-url", url)
    head, header, *lines = out.splitlines()
    assert [_cells(header, line)["LOST"] for line in lines] == ["-", "-"]
    assert head.endswith("lost - tokens")


def test_a_single_turn_conversation_says_one_turn(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    engine = create_sync_engine_for(url)
    with engine.begin() as conn:
        store_records(conn, [replace(conversation_records(utc_now() - timedelta(hours=1))[4], request_id="req_single",
                                     conversation_id="conv-single")])
    engine.dispose()
    code, out, _ = _run(capsys, "conversation", "conv-single", "--database-url", url)
    assert code == 0 and ": 1 turn, " in out.splitlines()[0]


def test_refused_requests_are_not_listed(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "conversations", "--json", "--database-url", url)
    assert "conv-refused" not in [row["conversation_id"] for row in json.loads(out)]
    code, _, err = _run(capsys, "conversation", "conv-refused", "--database-url", url)
    assert code == 2 and "no conversation 'conv-refused'" in err


@pytest.mark.parametrize(
    ("argv", "param"),
    [
        (["conversations", "--since", "3000000d"], "since"),
        (["stats", "--since", "3000000d"], "since"),
        (["conversations", "--until", "3000000d"], "until"),
        (["conversations", "--since", "1h", "--until", "2h"], "since"),
        (["stats", "--since", "1h", "--until", "2h"], "since"),
        (["conversations", "--limit", "0"], "limit"),
        (["conversations", "--limit", "-5"], "limit"),
        (["conversations", "--limit", "abc"], "limit"),
        (["conversations", "--limit", "1001"], "limit"),
    ],
)
def test_a_range_or_limit_the_api_refuses_exits_2_with_its_message(
    url: str, capsys: pytest.CaptureFixture[str], argv: list[str], param: str
) -> None:
    """The CLI validates `--since`, `--until` and `--limit` as `GET /api/conversations` does (`db.query_params`):
    exit status 2 and the API's message on one line, no traceback."""
    options = dict(zip(argv[1::2], argv[2::2], strict=True))
    with pytest.raises(QueryParamError) as refused:
        time_range(options.get("--since"), options.get("--until"), "7d")
        row_limit(options.get("--limit"), 50, CONVERSATIONS_MAX_LIMIT)
    assert refused.value.param == param
    code, out, err = _run(capsys, *argv, "--database-url", url)
    assert (code, out) == (2, "")
    assert err == f"prefixscope: error: {refused.value}\n"
