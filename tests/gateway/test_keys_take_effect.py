"""A key works on the request right after `keys create`; refusals say what is true (no key at all, an unknown key, a
revoked key); and unknown keys cannot make the gateway read its key table more than a few times a second."""

from __future__ import annotations

import asyncio
import sqlite3

import openai
import pytest
from gateway_testkit import db_storage, gateway_config, running_gateway

from db.engine import create_sync_engine_for
from db.keys import create_api_key, revoke_api_key
from gateway.auth import NO_KEY_EXISTS, REVOKED_KEY, UNKNOWN_KEY, KeySnapshot, KeyStore
from gateway.errors import ServiceUnavailable, Unauthorized


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def _chat(client: openai.OpenAI) -> object:
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)


def test_a_key_created_now_works_on_its_first_request(stub, stub_url, tmp_path):
    """The background refresh is a minute away: only the re-read that an unknown key causes can let the key in."""
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    config = gateway_config(stub_url, auth="keys", key_refresh_interval_s=60.0)
    with running_gateway(config, db_storage(url, tmp_path)) as gw:
        with pytest.raises(openai.InternalServerError) as none_yet:
            _chat(_client(gw.url, "psk-0000-made-up"))
        assert none_yet.value.status_code == 503
        assert none_yet.value.body["message"] == NO_KEY_EXISTS  # true: the table was re-read and is empty

        engine = create_sync_engine_for(url)
        try:
            created = create_api_key(engine, "acme")
            answer = _chat(_client(gw.url, created.plaintext_key))  # at once: no wait, no retry
            assert answer.choices[0].message.content
            with pytest.raises(openai.AuthenticationError) as unknown:
                _chat(_client(gw.url, created.plaintext_key[:-3] + "xyz"))
            assert unknown.value.body["message"] == UNKNOWN_KEY
            second = create_api_key(engine, "beta")
            assert _chat(_client(gw.url, second.plaintext_key)).choices[0].message.content
            assert revoke_api_key(engine, created.key_id)
        finally:
            engine.dispose()
    with sqlite3.connect(tmp_path / "keys.db") as conn:
        statuses = [row[0] for row in conn.execute("SELECT status_code FROM requests ORDER BY created_at, id")]
    assert statuses == [503, 200, 401, 200]  # one row per call: nothing was retried


async def test_a_revoked_key_is_refused_as_revoked_and_an_unknown_one_as_unknown():
    table = {"good": "acme", "old": "acme"}
    revoked: dict[str, str] = {}

    class Entry:
        def __init__(self, key_id: str) -> None:
            self.key_id, self.tenant, self.is_admin = key_id, table.get(key_id) or revoked[key_id], False

    async def loader() -> KeySnapshot:
        return KeySnapshot(
            entries={k: Entry(k) for k in table},
            any_key_exists=bool(table or revoked),
            revoked={k: Entry(k) for k in revoked},
        )

    store = KeyStore(loader, lambda token, entries: entries.get(token), refresh_interval_s=60)
    assert await store.refresh()
    assert (await store.authenticate_now("Bearer old")).tenant == "acme"
    revoked["old"] = table.pop("old")
    assert await store.refresh()
    with pytest.raises(Unauthorized) as was_revoked:
        await store.authenticate_now("Bearer old")
    assert was_revoked.value.message == REVOKED_KEY
    with pytest.raises(Unauthorized) as unknown:
        await store.authenticate_now("Bearer nobody")
    assert unknown.value.message == UNKNOWN_KEY
    with pytest.raises(Unauthorized) as missing:
        await store.authenticate_now(None)
    assert "didn't provide an API key" in missing.value.message
    table.clear()
    revoked.clear()
    assert await store.refresh()
    with pytest.raises(ServiceUnavailable) as empty:
        await store.authenticate_now("Bearer good")
    assert empty.value.message == NO_KEY_EXISTS


async def test_a_flood_of_unknown_keys_is_a_bounded_number_of_reads():
    """500 requests with bad keys at once share one re-read; a steady stream of them gets at most one re-read per
    interval, however many requests it sends."""
    reads = {"n": 0}

    async def loader() -> KeySnapshot:
        reads["n"] += 1
        await asyncio.sleep(0.01)  # a database round trip
        return KeySnapshot(entries={}, any_key_exists=True)

    store = KeyStore(loader, lambda token, entries: entries.get(token), refresh_interval_s=60,
                     min_reread_interval_s=0.2)
    assert await store.refresh()
    reads["n"] = 0

    async def bad(i: int) -> None:
        with pytest.raises(Unauthorized):
            await store.authenticate_now(f"Bearer bad-{i}")

    await asyncio.gather(*(bad(i) for i in range(500)))
    assert reads["n"] == 1 and store.rereads == 1

    loop = asyncio.get_running_loop()
    started = loop.time()
    sent = 0
    while loop.time() - started < 0.5:
        await asyncio.gather(*(bad(sent + i) for i in range(20)))
        sent += 20
    elapsed = loop.time() - started
    assert sent >= 40
    assert reads["n"] <= 1 + elapsed / 0.2 + 1  # never one read per request
