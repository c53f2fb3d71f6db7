"""Acceptance: explanations follow what the real engine matched. For edits at known places in each segment the stored
divergence segment is right and its offset lies within one token of the edit; a request that reused part of its
prompt is never `new_prefix`; a match of the template's opening alone is not a hit; non-streamed requests get the
engine's TTFT."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from real_engine_kit import MODEL, keyed_gateway, stored

from gateway.config import TenantSettings

pytestmark = pytest.mark.real_model

# The system prompt of the trial: about 1,300 characters of rules.
SYSTEM = "".join(
    f"Rule {n}: when a customer asks about an order, check its status first and quote section {n} of the policy. "
    for n in range(1, 14)
)
TOOLS = [
    {"type": "function", "function": {"name": "lookup_order", "description": "Find an order by its id.",
                                      "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "refund", "description": "Refund an order in full or in part.",
                                      "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}}}},
]
HISTORY = "My order 1182 arrived with a broken handle and the box was soaked; I would like to know my options. " * 3
MAX_TOKEN_CHARS = 12  # the longest token of this English text, in characters
PLAIN = TenantSettings(rules=frozenset(), uplift_sample_rate=0.0)
TENANTS = ("system", "tools", "messages", "trial", "crlf", "opening", "ttft", "midsystem")


@dataclass
class Deployment:
    url: str
    keys: dict[str, str]
    database_url: str
    engine_url: str

    def chat(self, tenant: str, **body: Any) -> httpx.Response:
        request = {"model": MODEL, "max_tokens": 1, "temperature": 0, **body}
        headers = {"authorization": f"Bearer {self.keys[tenant]}"}
        response = httpx.post(f"{self.url}/v1/chat/completions", json=request, headers=headers, timeout=120)
        assert response.status_code == 200, response.text
        return response

    def row(self, response: httpx.Response) -> dict[str, Any]:
        request_id = response.headers["x-request-id"]
        return stored(self.database_url, "requests", "id", [request_id])[request_id]


@pytest.fixture(scope="module")
def deployment(engine_url: str, tmp_path_factory) -> Iterator[Deployment]:
    tenants = dict.fromkeys(TENANTS, PLAIN)
    with keyed_gateway(engine_url, tmp_path_factory.mktemp("located"), tenants) as (url, keys, database_url):
        yield Deployment(url, keys, database_url, engine_url)


def messages(system: str = SYSTEM, history: str = HISTORY, question: str = "What can I do?") -> list[dict]:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": history},
        {"role": "assistant", "content": "I am sorry about that. Shall I look it up?"},
        {"role": "user", "content": question},
    ]


def replace_at(text: str, at: int, new: str) -> str:
    return text[:at] + new + text[at + 1 :]


def assert_located(row: dict[str, Any], reason: str, segment: str, edit_offset: int) -> None:
    assert (row["miss_reason"], row["divergence_segment"], row["divergence_source"]) == (reason, segment, "engine")
    assert 0 <= edit_offset - row["divergence_char_offset"] <= MAX_TOKEN_CHARS
    assert row["cached_tokens"] > row["template_tokens"]  # part of the prompt was reused
    assert row["diverged_at_token"] == row["cached_tokens"]
    assert row["recomputed_tokens"] == row["prompt_tokens"] - row["cached_tokens"]


def test_an_edit_in_the_system_prompt(deployment: Deployment):
    deployment.chat("system", messages=messages())
    edited = deployment.chat("system", messages=messages(system=replace_at(SYSTEM, 900, "X")))
    assert_located(deployment.row(edited), "system_changed", "system", 900)


def test_an_edit_in_the_tools(deployment: Deployment):
    deployment.chat("tools", messages=messages(), tools=TOOLS)
    changed = json.loads(json.dumps(TOOLS))
    changed[1]["function"]["description"] = "Refund an order, in full or in part."
    edit_offset = "\n".join(json.dumps(t) for t in TOOLS).index("Refund an order") + len("Refund an order")
    edited = deployment.chat("tools", messages=messages(), tools=changed)
    assert_located(deployment.row(edited), "tools_changed", "tools", edit_offset)


def test_an_edit_in_an_earlier_message(deployment: Deployment):
    deployment.chat("messages", messages=messages())
    edited = deployment.chat("messages", messages=messages(history=replace_at(HISTORY, 150, "Z")))
    assert_located(deployment.row(edited), "messages_changed", "messages[1]", 150)


def test_the_trial_sequence_follows_the_engine_not_the_latest_request(deployment: Deployment):
    """A (base) -> B (edit near the end of the system prompt) -> C (a date line prepended) -> D (the date changed)
    -> E (an edit about 560 characters in): E is located at about 560, where the engine's match ended, although the
    latest earlier requests (C, D) differ from it at character 0."""
    base = deployment.chat("trial", messages=messages())
    deployment.chat("trial", messages=messages(system=replace_at(SYSTEM, len(SYSTEM) - 20, "Y")))
    deployment.chat("trial", messages=messages(system="Today is 2026-11-29.\n" + SYSTEM))
    dated = deployment.chat("trial", messages=messages(system="Today is 2026-11-30.\n" + SYSTEM))
    edited = deployment.chat("trial", messages=messages(system=replace_at(SYSTEM, 560, "Q")))
    assert deployment.row(base)["miss_reason"] == "new_prefix"
    assert deployment.row(dated)["miss_reason"] == "volatile_value"
    assert deployment.row(dated)["divergence_segment"] == "system"
    assert 0 <= len("Today is 2026-11-3") - deployment.row(dated)["divergence_char_offset"] <= MAX_TOKEN_CHARS
    assert_located(deployment.row(edited), "system_changed", "system", 560)


def test_an_edit_in_the_middle_of_the_system_prompt_is_never_new_prefix(deployment: Deployment):
    deployment.chat("midsystem", messages=messages())
    middle = len(SYSTEM) // 2
    edited = deployment.chat("midsystem", messages=messages(system=SYSTEM[:middle] + "Never mention refunds. "))
    row = deployment.row(edited)
    assert row["miss_reason"] == "system_changed" and row["miss_reason"] != "new_prefix"
    assert 0 <= middle - row["divergence_char_offset"] <= MAX_TOKEN_CHARS


def test_a_crlf_variant_is_not_new_prefix(deployment: Deployment):
    text = SYSTEM.replace(". ", ".\n")
    deployment.chat("crlf", messages=messages(system=text))
    variant = deployment.chat("crlf", messages=messages(system=text.replace("\n", "\r\n")))
    row = deployment.row(variant)
    first_newline = text.index("\n")
    assert row["miss_reason"] == "system_changed" and row["divergence_segment"] == "system"
    assert 0 <= first_newline - row["divergence_char_offset"] <= MAX_TOKEN_CHARS


def test_a_match_of_the_template_opening_alone_is_not_a_hit(deployment: Deployment):
    deployment.chat("opening", messages=messages())
    unrelated = [{"role": "system", "content": "You translate English into French."},
                 {"role": "user", "content": "Good morning."}]
    other = deployment.chat("opening", messages=unrelated)
    row = deployment.row(other)
    assert row["template_tokens"] == 3 and row["cached_tokens"] == 3  # <|im_start|> system \n
    assert (row["miss_kind"], row["miss_reason"], row["divergence_segment"]) == ("cold", "new_prefix", "system")
    assert row["divergence_char_offset"] == 0  # the engine's report, recorded for a cold miss too


def test_non_streamed_requests_record_the_engine_s_ttft(deployment: Deployment):
    plain = deployment.chat("ttft", messages=messages())
    streamed = deployment.chat("ttft", messages=messages(), stream=True)
    plain_row, streamed_row = deployment.row(plain), deployment.row(streamed)
    assert plain_row["ttft_source"] == "engine"
    assert plain_row["ttft_ms"] == pytest.approx(float(plain.headers["x-prefix-cache-ttft-ms"]), abs=0.001)
    assert streamed_row["ttft_source"] == "gateway" and streamed_row["ttft_ms"] > 0


def test_each_tenant_s_namespace_label_is_recorded_with_its_tenant(deployment: Deployment):
    response = deployment.chat("ttft", messages=messages())
    deployment.row(response)
    [row] = stored(deployment.database_url, "namespace_tenants", "tenant", ["ttft"]).values()
    tree = httpx.get(f"{deployment.engine_url}/v1/cache/tree", timeout=30).json()
    assert row["namespace_label"] in {entry["namespace"] for entry in tree["namespaces"]}
