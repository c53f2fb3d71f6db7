"""Providers' own cache diagnostics and the derived `prompt_cache_key`, against stub OpenAI (Responses) and Anthropic
upstreams that return diagnostics as those providers document them, through the gateway into SQLite and onto the
dashboard's Requests page. The clients are the official `openai` and `anthropic` packages."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import anthropic
import openai
import pytest
from anthropic_stub import STUB_MISSED_TOKENS as ANTHROPIC_MISSED
from anthropic_stub import AnthropicStub
from gateway_testkit import TEST_SECRET, db_storage, gateway_config, running_gateway, serve_in_thread
from real_engine_kit import create_keys, stored
from responses_stub import STUB_MISSED_TOKENS as OPENAI_MISSED
from responses_stub import ResponsesStub

from gateway.config import UpstreamConfig
from gateway.tenancy import derive_salt
from gateway.upstreams.prompt_cache_key import derive_prompt_cache_key

INSTRUCTIONS = "You are the support assistant of a bicycle shop. Be brief and friendly. " * 8


@dataclass
class Deployment:
    url: str
    keys: dict[str, str]
    database_url: str
    openai_stub: ResponsesStub
    anthropic_stub: AnthropicStub

    def openai(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.keys[tenant], max_retries=0, timeout=30)

    def anthropic(self, tenant: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=self.keys[tenant], max_retries=0, timeout=30)

    def rows(self, request_ids: list[str]) -> dict[str, dict]:
        return stored(self.database_url, "requests", "id", request_ids)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    database_url = f"sqlite:///{tmp_path}/gateway.db"
    keys = create_keys(database_url, ["acme", "beta"])
    openai_stub, anthropic_stub = ResponsesStub(), AnthropicStub()
    with serve_in_thread(openai_stub) as openai_url, serve_in_thread(anthropic_stub) as anthropic_url:
        config = gateway_config(
            openai_url,
            upstreams=(
                UpstreamConfig(name="openai", url=openai_url, kind="openai", timeout_s=30.0),
                UpstreamConfig(name="claude", url=anthropic_url, kind="anthropic", timeout_s=30.0),
            ),
            default_upstream="openai",
            routes={"claude-x": "claude"},
            auth="keys",
        )
        defaults = config.tenant_defaults
        config = replace(config, tenants={"acme": replace(defaults, diagnostics=True), "beta": defaults})
        with running_gateway(config, db_storage(database_url, tmp_path)) as gw:
            yield Deployment(gw.url, keys, database_url, openai_stub, anthropic_stub)


def create(client: openai.OpenAI, **params):
    raw = client.responses.with_raw_response.create(model="gpt-x", instructions=INSTRUCTIONS, **params)
    return raw.headers["x-request-id"], raw.parse()


def test_openai_diagnostics_are_asked_for_recorded_and_ids_stay_with_their_tenant(deployment: Deployment):
    acme, beta = deployment.openai("acme"), deployment.openai("beta")
    sent = deployment.openai_stub.state.requests
    first_id, first = create(acme, input="When are you open?", prompt_cache_key="client-chosen")
    # The first turn has no baseline to compare with; its prompt_cache_key is the gateway's, per tenant and prefix.
    assert "prompt_cache_options" not in sent[0]
    expected_key = derive_prompt_cache_key(
        derive_salt(TEST_SECRET, "acme"), {"model": "gpt-x", "instructions": INSTRUCTIONS, "input": "x",
                                           "prompt_cache_key": "client-chosen"}
    )
    assert sent[0]["prompt_cache_key"] == expected_key != "client-chosen"
    # The next request on the same prefix is compared with the tenant's previous response (streamed here).
    with acme.responses.with_streaming_response.create(
        model="gpt-x", instructions=INSTRUCTIONS, input="Can you fix a flat tyre?", stream=True
    ) as streamed:
        second_id = streamed.headers["x-request-id"]
        events = [line for line in streamed.iter_lines() if line.startswith("event:")]
    assert events[-1] == "event: response.completed"
    assert sent[1]["prompt_cache_options"] == {"comparison_response_id": first.id}
    # A client's previous_response_id is the baseline it means, and continues the upstream's conversation.
    third_id, third = create(acme, input="Thanks!", previous_response_id="resp_upstream2")
    assert sent[2]["previous_response_id"] == "resp_upstream2"
    assert sent[2]["prompt_cache_options"] == {"comparison_response_id": "resp_upstream2"}
    # Read from the wire form: SDK versions that predate the typed field keep it as an extra.
    assert third.to_dict()["prompt_cache_diagnostics"]["type"] == "cache_miss"
    # Another tenant can neither continue nor read acme's responses, and is not asked about (diagnostics off).
    before = len(sent)
    with pytest.raises(openai.NotFoundError):
        beta.responses.create(model="gpt-x", input="Hi", previous_response_id=first.id)
    with pytest.raises(openai.NotFoundError):
        beta.responses.retrieve(first.id)
    assert len(sent) == before
    assert acme.responses.retrieve(first.id).id == first.id  # read from the upstream for its tenant
    beta_id, _ = create(beta, input="When are you open?", prompt_cache_key="client-chosen")
    assert "prompt_cache_options" not in sent[-1]
    assert sent[-1]["prompt_cache_key"] != expected_key  # the same prefix, another tenant: another key

    rows = deployment.rows([first_id, second_id, third_id, beta_id])
    assert {row["endpoint"] for row in rows.values()} == {"responses"}
    assert (rows[first_id]["prompt_tokens"], rows[first_id]["cached_tokens"]) == (2048, 1024)
    assert rows[first_id]["provider_miss_reason"] is None
    assert (rows[second_id]["provider_miss_reason"], rows[second_id]["provider_missed_tokens"]) == (
        "tools_changed", OPENAI_MISSED)
    assert rows[second_id]["stream"] and rows[second_id]["ttft_ms"] is not None
    assert rows[third_id]["provider_miss_reason"] == "tools_changed"
    assert rows[beta_id]["provider_miss_reason"] is None


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_diagnostics_are_asked_for_and_recorded(deployment: Deployment, stream: bool):
    client = deployment.anthropic("acme")
    sent = deployment.anthropic_stub.state.requests
    ids = []
    for question in ("When are you open?", "Can you fix a flat tyre?"):
        params = {"model": "claude-x", "max_tokens": 8, "system": INSTRUCTIONS,
                  "messages": [{"role": "user", "content": question}]}
        if stream:
            with client.messages.with_streaming_response.create(**params, stream=True) as response:
                ids.append(response.headers["x-request-id"])
                list(response.iter_lines())
        else:
            ids.append(client.messages.with_raw_response.create(**params).headers["x-request-id"])
    assert sent[0]["diagnostics"] == {"previous_message_id": None}  # opted in, nothing to compare with yet
    assert sent[1]["diagnostics"] == {"previous_message_id": "msg_stub1"}
    rows = deployment.rows(ids)
    assert rows[ids[0]]["provider_miss_reason"] == "no_divergence"
    assert (rows[ids[1]]["provider_miss_reason"], rows[ids[1]]["provider_missed_tokens"]) == (
        "system_changed", ANTHROPIC_MISSED)
    # Without the setting nothing is asked for.
    deployment.anthropic("beta").messages.create(
        model="claude-x", max_tokens=8, system=INSTRUCTIONS, messages=[{"role": "user", "content": "Hi"}]
    )
    assert "diagnostics" not in sent[-1]


def test_the_requests_page_shows_the_providers_reason_beside_prefixscopes(deployment: Deployment, monkeypatch):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from dashboard import settings as names

    acme = deployment.openai("acme")
    create(acme, input="When are you open?")
    request_id, _ = create(acme, input="Can you fix a flat tyre?")
    deployment.rows([request_id])
    monkeypatch.setenv(names.ENV_DATABASE_URL, deployment.database_url)
    monkeypatch.setenv(names.ENV_ENGINE_URL, "http://127.0.0.1:9")
    monkeypatch.setenv(names.ENV_ENGINE_TIMEOUT_S, "2")
    st.cache_data.clear()
    st.cache_resource.clear()
    script = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
    app = AppTest.from_file(str(script), default_timeout=60).run()
    app.switch_page("views/requests.py").run()
    app.text_input[0].set_value(request_id).run()
    assert not app.exception, [item.message for item in app.exception]
    text = "\n".join(item.value for item in app.markdown)
    assert "**Why:**" in text
    assert (
        f"**Provider's reason:** `tools_changed` (the upstream 'openai''s own diagnosis); it estimates "
        f"{OPENAI_MISSED:,} input tokens missed the cache"
    ) in text
    st.cache_data.clear()
    st.cache_resource.clear()
