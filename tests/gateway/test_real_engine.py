"""The gateway in front of the real engine (SmolLM2-135M-Instruct on the CPU), driven by the `openai` package.

One engine process (the session's `engine_url`) serves the whole module. Every test starts its prompts with a fresh
nonce so that nothing cached by an earlier test can help it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from gateway_testkit import TcpProxy, db_storage, gateway_config, running_gateway, wait_until
from sqlalchemy import bindparam, create_engine, text

from gateway.config import TenantSettings, UpstreamConfig

pytestmark = pytest.mark.real_model

MODEL = "smollm2"
LONG_SYSTEM = (
    "You are the support assistant of a bicycle shop. You answer questions about orders, repairs, spare parts "
    "and opening hours. Be brief, be friendly, and never invent order numbers or prices. "
) * 4
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Find an order by its id.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string", "description": "the id"}},
                "required": ["order_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_repair",
            "description": "Book a repair slot.",
            "parameters": {"type": "object", "properties": {"day": {"type": "string"}, "bike": {"type": "string"}}},
        },
    },
]


def reordered_tools() -> list[dict]:
    """The same tools in the other order, with every object's keys in reverse order."""

    def reverse_keys(value):
        if isinstance(value, dict):
            return {k: reverse_keys(value[k]) for k in reversed(list(value))}
        if isinstance(value, list):
            return [reverse_keys(v) for v in value]
        return value

    return [reverse_keys(tool) for tool in reversed(TOOLS)]


@dataclass
class Deployment:
    url: str
    keys: dict[str, str]
    database_url: str
    storage: object

    def client(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.keys[tenant], max_retries=0, timeout=120)

    def rows(self, request_ids: list[str]) -> list[dict]:
        """The stored rows of these requests, once the writer has written them all (bounded wait)."""
        engine = create_engine(self.database_url.replace("postgresql://", "postgresql+psycopg://"))
        query = text("SELECT * FROM requests WHERE id IN :ids").bindparams(bindparam("ids", expanding=True))
        try:

            def fetch() -> list[dict]:
                with engine.connect() as conn:
                    return [dict(row._mapping) for row in conn.execute(query, {"ids": request_ids})]

            wait_until(lambda: len(fetch()) >= len(request_ids))
            return fetch()
        finally:
            engine.dispose()


def deploy(engine_url: str, tmp_path: Path, database_url: str | None = None):
    """A gateway with keys for tenants alpha, beta and plain (plain has every rule off), recording to a database."""
    from db.keys import create_api_key
    from db.migrate import upgrade

    database_url = database_url or f"sqlite:///{tmp_path}/gateway.db"
    upgrade(database_url)
    sync_engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    keys = {tenant: create_api_key(sync_engine, tenant).plaintext_key for tenant in ("alpha", "beta", "plain")}
    sync_engine.dispose()
    config = gateway_config(
        engine_url,
        upstreams=(UpstreamConfig(name="engine", url=engine_url, kind="local_engine", timeout_s=300.0),),
        default_upstream="engine",
        tenants={"plain": TenantSettings(rules=frozenset())},
        auth="keys",
    )
    return config, keys, database_url


@pytest.fixture
def deployment(engine_url: str, tmp_path: Path) -> Iterator[Deployment]:
    config, keys, database_url = deploy(engine_url, tmp_path)
    storage = db_storage(database_url, tmp_path)
    with running_gateway(config, storage) as gw:
        yield Deployment(gw.url, keys, database_url, storage)


def nonce_messages(user: str) -> list[dict]:
    return [
        {"role": "system", "content": f"[session {uuid.uuid4().hex}] {LONG_SYSTEM}"},
        {"role": "user", "content": user},
    ]


def test_shared_system_prompt_hits_the_cache_plain_and_streamed(deployment: Deployment):
    client = deployment.client("alpha")
    messages = nonce_messages("When are you open?")
    first = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=4)
    second_messages = [messages[0], {"role": "user", "content": "Can you fix a flat tyre?"}]
    second = client.chat.completions.with_raw_response.create(model=MODEL, messages=second_messages, max_tokens=4)
    first_usage, second_usage = first.parse().usage, second.parse().usage
    assert first_usage.prompt_tokens_details.cached_tokens == 0
    assert second_usage.prompt_tokens_details.cached_tokens > 100  # the long system prompt

    third_messages = [messages[0], {"role": "user", "content": "Do you sell bells?"}]
    streamed = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=third_messages, max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(streamed.parse())
    streamed_usage = chunks[-1].usage
    assert streamed_usage.prompt_tokens_details.cached_tokens > 100
    hidden = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[messages[0], {"role": "user", "content": "Bye"}], max_tokens=4, stream=True
    )
    assert all(chunk.usage is None for chunk in hidden.parse())

    responses = [first, second, streamed, hidden]
    ids = [r.headers["x-request-id"] for r in responses]
    rows = {row["id"]: row for row in deployment.rows(ids)}
    assert sorted(rows) == sorted(ids)  # exactly one row per request
    assert [rows[i]["cached_tokens"] for i in ids[:3]] == [
        0,
        second_usage.prompt_tokens_details.cached_tokens,
        streamed_usage.prompt_tokens_details.cached_tokens,
    ]
    assert [rows[i]["miss_kind"] for i in ids[:2]] == ["cold", "partial"]
    assert rows[ids[3]]["cached_tokens"] > 100  # recorded even though the client never saw the usage
    assert rows[ids[2]]["stream"] and rows[ids[2]]["ttft_ms"] is not None
    assert all(rows[i]["tenant"] == "alpha" and rows[i]["status_code"] == 200 for i in ids)


def test_reordered_tools_hit_the_cache_only_with_normalization(deployment: Deployment):
    messages = nonce_messages("Where is order 77?")
    results = {}
    for tenant in ("alpha", "plain"):
        client = deployment.client(tenant)
        client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=2)
        again = client.chat.completions.create(model=MODEL, messages=messages, tools=reordered_tools(), max_tokens=2)
        results[tenant] = again.usage
    normalized, plain = results["alpha"], results["plain"]
    # Normalized, the second prompt is byte-identical to the first: everything but the last token is cached,
    # the tool definitions (rendered first) included.
    assert normalized.prompt_tokens_details.cached_tokens == normalized.prompt_tokens - 1
    # Without the rules the prompts differ inside the first tool definition, near the start.
    assert plain.prompt_tokens_details.cached_tokens < 40


def test_tenants_never_share_cached_prefixes(deployment: Deployment):
    messages = nonce_messages("Hello")
    alpha, beta = deployment.client("alpha"), deployment.client("beta")
    alpha.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    alpha_again = alpha.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert alpha_again.usage.prompt_tokens_details.cached_tokens > 100
    beta_first = beta.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, extra_body={"cache_salt": "trying to join alpha"}
    )
    assert beta_first.usage.prompt_tokens_details.cached_tokens == 0
    beta_again = beta.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert beta_again.usage.prompt_tokens_details.cached_tokens > 100


@pytest.mark.postgres
def test_database_outage_mid_run_loses_nothing(engine_url: str, tmp_path: Path, postgres_database: str):
    proxy = TcpProxy("127.0.0.1", 5432)
    proxy.start()
    direct_url = f"postgresql://root@127.0.0.1:5432/{postgres_database}"
    config, keys, _ = deploy(engine_url, tmp_path, direct_url)
    storage = db_storage(f"postgresql://root@127.0.0.1:{proxy.port}/{postgres_database}", tmp_path)
    ids: list[str] = []
    try:
        with running_gateway(config, storage) as gw:
            client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=keys["alpha"], max_retries=0, timeout=120)
            messages = nonce_messages("Hi")

            def call(stream: bool) -> None:
                raw = client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=messages, max_tokens=2, stream=stream
                )
                body = raw.parse()
                if stream:
                    list(body)
                ids.append(raw.headers["x-request-id"])

            call(False)
            assert wait_until(lambda: storage.sink.counters().written == 1)
            proxy.stop()
            for stream in (False, True, False):
                call(stream)  # the database is gone; requests still succeed
            assert wait_until(lambda: storage.sink.counters().spilled >= 3)
            proxy.start()
            assert wait_until(
                lambda: storage.sink.counters().replayed >= 3 and storage.sink.counters().pending_spill == 0
            )
            assert wait_until(lambda: storage.sink.counters().queued == 0)
    finally:
        proxy.close()
    engine = create_engine(direct_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        stored = [row[0] for row in conn.execute(text("SELECT id FROM requests"))]
    engine.dispose()
    assert sorted(stored) == sorted(ids)
