"""`GET /api/conversations` and `/api/conversations/{id}` over a real database: who sees what, the figures, and the
parameters refused."""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import datetime, timedelta

import httpx
import pytest
from gateway_testkit import db_storage, gateway_config, running_gateway

from db.conversation_window import CONVERSATIONS_DEFAULT_SINCE
from db.engine import create_sync_engine_for
from db.keys import create_api_key
from db.migrate import upgrade
from db.store import store_records
from db.timeutil import parse_duration, utc_now
from prefixscope.cli import main
from tests.conversation_samples import EXPECTED, comparable, conversation_records, figures


@contextmanager
def gateway_over_samples(stub_url, tmp_path, age: timedelta):
    """A gateway with key auth over a database holding the sample conversations, the first turn `age` ago; yields
    (the running gateway, the admin's and each tenant's key, the database URL)."""
    url = f"sqlite:///{tmp_path}/conversations.db"
    upgrade(url)
    engine = create_sync_engine_for(url)
    with engine.begin() as conn:
        store_records(conn, conversation_records(utc_now() - age))
    keys = {
        "admin": create_api_key(engine, "ops", is_admin=True).plaintext_key,
        "acme": create_api_key(engine, "acme").plaintext_key,
        "beta": create_api_key(engine, "beta").plaintext_key,
    }
    engine.dispose()
    with running_gateway(gateway_config(stub_url, auth="keys"), db_storage(url, tmp_path)) as gw:
        yield gw, keys, url


@pytest.fixture
def conversations_gateway(stub_url, tmp_path):
    with gateway_over_samples(stub_url, tmp_path, timedelta(hours=1)) as (gw, keys, _):
        yield gw, keys


def get(gw, key, path="", **params):
    return httpx.get(f"{gw.url}/api/conversations{path}", params=params, headers={"authorization": f"Bearer {key}"})


def test_admin_sees_every_tenant_worst_first(conversations_gateway):
    gw, keys = conversations_gateway
    body = get(gw, keys["admin"]).json()
    assert (body["tenant"], body["limit"]) == (None, 100)
    assert [row["conversation_id"] for row in body["data"]] == ["conv-a", "conv-b", "conv-c"]
    for row in body["data"]:
        assert figures(row) == comparable(EXPECTED[row["conversation_id"]])
    unknown = body["data"][2]
    assert unknown["cached_tokens"] is None and unknown["eligible_hit_rate"] is None  # null, never 0
    assert [row["conversation_id"] for row in get(gw, keys["admin"], tenant="beta").json()["data"]] == ["conv-c"]
    assert len(get(gw, keys["admin"], limit="1").json()["data"]) == 1


def test_tenant_key_sees_only_its_own(conversations_gateway):
    gw, keys = conversations_gateway
    body = get(gw, keys["acme"]).json()
    assert body["tenant"] == "acme"
    assert [row["conversation_id"] for row in body["data"]] == ["conv-a", "conv-b"]
    assert get(gw, keys["acme"], tenant="beta").status_code == 403
    assert get(gw, keys["beta"], "/conv-c").status_code == 200
    refused = get(gw, keys["beta"], "/conv-a")  # another tenant's conversation: as if it did not exist
    assert refused.status_code == 404 and refused.json()["error"]["type"] == "not_found_error"
    assert get(gw, keys["acme"], "/conv-c").status_code == 404
    assert get(gw, keys["acme"], "/no-such-id").status_code == 404


def test_one_conversation_turn_by_turn(conversations_gateway):
    gw, keys = conversations_gateway
    body = get(gw, keys["acme"], "/conv-a").json()
    assert body["conversation"]["turns"] == 4 and body["conversation"]["lost_tokens"] == 912
    turns = body["turns"]
    assert [turn["turn_index"] for turn in turns] == [1, 2, 3, 4]
    for turn in turns:
        parts = turn["cached_tokens"] + turn["new_tokens"] + sum(turn["lost"].values()) + turn["unknown_tokens"]
        assert parts == turn["prompt_tokens"] and turn["adds_up"] is True
    assert turns[2]["answer_rewrite"] == "whitespace" and turns[2]["replica_changed"] is True
    assert turns[2]["cached_by_tier"] == {"device": 64, "host": 32, "disk": 0}
    assert [turn["idle_beyond_ttl"] for turn in turns] == [None, False, True, True]
    unknown = get(gw, keys["admin"], "/conv-c").json()["turns"]
    assert [(t["cached_tokens"], t["new_tokens"], t["unknown_tokens"]) for t in unknown] == [(None, None, 300)] * 2


def test_parameters_are_refused_by_name(conversations_gateway):
    gw, keys = conversations_gateway
    for params, name in (({"since": "yesterday-ish"}, "since"), ({"limit": "0"}, "limit"),
                         ({"limit": "many"}, "limit"), ({"limit": "1001"}, "limit")):
        answer = get(gw, keys["admin"], **params)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == name
    assert get(gw, keys["admin"], "/" + "x" * 65).status_code == 400
    assert httpx.get(f"{gw.url}/api/conversations").status_code == 401


def test_open_gateway_without_conversations(stub_url):
    with running_gateway(gateway_config(stub_url)) as gw:  # open mode: every caller reads as an admin
        assert httpx.get(f"{gw.url}/api/conversations").json()["data"] == []
        assert httpx.get(f"{gw.url}/api/conversations/conv-a").status_code == 404


def test_the_default_range_is_the_cli_s(stub_url, tmp_path, capsys):
    """Without `since`, the API and `prefixscope conversations` list the same conversations: those of the last
    `CONVERSATIONS_DEFAULT_SINCE` (the samples are three days old)."""
    with gateway_over_samples(stub_url, tmp_path, timedelta(days=3)) as (gw, keys, url):
        body = get(gw, keys["admin"]).json()
        assert main(["conversations", "--json", "--database-url", url]) == 0
    since, until = (datetime.fromisoformat(body[end].replace("Z", "+00:00")) for end in ("since", "until"))
    assert until - since == parse_duration(CONVERSATIONS_DEFAULT_SINCE)
    listed = json.loads(capsys.readouterr().out)
    assert [row["conversation_id"] for row in body["data"]] == [row["conversation_id"] for row in listed]
    assert [row["conversation_id"] for row in listed] == ["conv-a", "conv-b", "conv-c"]


def test_the_key_may_come_in_x_api_key_as_on_v1_messages(conversations_gateway):
    gw, keys = conversations_gateway
    for path in ("/api/conversations", "/api/conversations/conv-a", "/api/stats"):
        answer = httpx.get(f"{gw.url}{path}", headers={"x-api-key": keys["acme"]})
        assert answer.status_code == 200, path
    assert httpx.get(f"{gw.url}/api/conversations", headers={"x-api-key": "wrong"}).status_code == 401


def test_a_parameter_given_twice_is_refused(conversations_gateway):
    gw, keys = conversations_gateway
    headers = {"authorization": f"Bearer {keys['admin']}"}
    for path, query in (("/api/conversations", "since=1h&since=2h"), ("/api/conversations", "limit=1&limit=2"),
                        ("/api/conversations/conv-a", "tenant=acme&tenant=beta"), ("/api/stats", "since=1h&since=2h")):
        answer = httpx.get(f"{gw.url}{path}?{query}", headers=headers)
        assert answer.status_code == 400, query
        assert answer.json()["error"]["param"] == query.split("=")[0]


def test_refusals_are_the_cli_s(conversations_gateway, stub_url, tmp_path, capsys):
    """An out-of-range duration, a reversed range and a bad limit: the API's 400 says what the CLI says."""
    gw, keys = conversations_gateway
    url = f"sqlite:///{tmp_path}/cli.db"
    upgrade(url)
    for params, argv in (({"since": "3000000d"}, ["--since", "3000000d"]),
                         ({"since": "1h", "until": "2h"}, ["--since", "1h", "--until", "2h"]),
                         ({"limit": "-5"}, ["--limit", "-5"])):
        answer = get(gw, keys["admin"], **params)
        assert answer.status_code == 400
        assert main(["conversations", *argv, "--database-url", url]) == 2
        assert capsys.readouterr().err == f"prefixscope: error: {answer.json()['error']['message']}\n"
    assert get(gw, keys["admin"], "/conv-refused").status_code == 404  # a refused request is no conversation
