"""The engine locates the first uncached token in the request's own terms, counts its template's fixed opening and
reports its time to first token: over real HTTP, on a tiny random Llama with SmolLM2's real tokenizer."""

from __future__ import annotations

import json

import httpx
import pytest

from local_engine.prompt.chat_prompt import chat_prompt, chat_prompt_token_ids, text_prompt
from local_engine.prompt.layout import Location

from .server_fixtures import served_engine
from .test_server import sse_events

SYSTEM = "".join(f"Rule {n}: answer returns questions politely and cite the policy section {n}. " for n in range(40))
TOOLS = [
    {"type": "function", "function": {"name": "lookup_order", "description": "Find an order by its id.",
                                      "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "refund", "description": "Refund an order in full or in part.",
                                      "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}}}},
]
HISTORY = "I bought a kettle last month and the lid no longer closes; the receipt is attached below. " * 6
# A token of SmolLM2's tokenizer spans at most this many characters of this English text.
MAX_TOKEN_CHARS = 12


def body(system=SYSTEM, tools=None, history=HISTORY, question="Can I return it?", salt="loc") -> dict:
    request = {
        "model": "tiny-llama",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": history},
            {"role": "assistant", "content": "Sorry to hear that. What would you like to do?"},
            {"role": "user", "content": question},
        ],
        "max_tokens": 2,
        "temperature": 0,
        "cache_salt": salt,
    }
    if tools is not None:
        request["tools"] = tools
    return request


def edit_at(text: str, at: int) -> str:
    return text[:at] + "X" + text[at + 1 :]


@pytest.fixture(scope="module")
def client(tiny_loaded):
    with served_engine(tiny_loaded, kv_cache_tokens=16384) as (base_url, _):
        with httpx.Client(base_url=base_url, timeout=60) as http:
            yield http


def send(client: httpx.Client, request: dict) -> httpx.Response:
    path = "/v1/chat/completions" if "messages" in request else "/v1/completions"
    response = client.post(path, json=request)
    assert response.status_code == 200, response.text
    return response


def assert_diverged_near(response: httpx.Response, segment: str, edit_offset: int) -> None:
    assert response.headers["x-prefix-cache-miss"] == "partial"
    assert response.headers["x-prefix-cache-divergence-segment"] == segment
    offset = int(response.headers["x-prefix-cache-divergence-offset"])
    assert 0 <= edit_offset - offset <= MAX_TOKEN_CHARS
    assert response.json()["prefix_cache"]["divergence"] == {"segment": segment, "char_offset": offset}


def test_an_edit_in_the_system_prompt_is_located_within_one_token(client):
    send(client, body(salt="sys"))
    edited = send(client, body(system=edit_at(SYSTEM, 560), salt="sys"))
    assert_diverged_near(edited, "system", 560)


def test_an_edit_in_the_tools_is_located_in_the_engine_s_rendering_of_them(client):
    send(client, body(tools=TOOLS, salt="tools"))
    changed = json.loads(json.dumps(TOOLS))
    changed[1]["function"]["description"] = "Refund an order, in full or in part."
    rendered = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in TOOLS)
    edit_offset = rendered.index("Refund an order") + len("Refund an order")
    assert_diverged_near(send(client, body(tools=changed, salt="tools")), "tools", edit_offset)


def test_an_edit_in_an_earlier_message_names_that_message(client):
    send(client, body(salt="msg"))
    assert_diverged_near(send(client, body(history=edit_at(HISTORY, 300), salt="msg")), "messages[1]", 300)


def test_a_new_question_diverges_at_the_start_of_the_final_turn(client):
    send(client, body(salt="turn"))
    response = send(client, body(question="Do you also sell lids?", salt="turn"))
    assert_diverged_near(response, "messages[3]", 0)


def test_a_completions_prompt_is_located_in_the_prompt(client):
    prompt = HISTORY * 2
    send(client, {"model": "tiny-llama", "prompt": prompt, "max_tokens": 2, "cache_salt": "cmp"})
    edited = {"model": "tiny-llama", "prompt": edit_at(prompt, 700), "max_tokens": 2, "cache_salt": "cmp"}
    response = send(client, edited)
    assert_diverged_near(response, "prompt", 700)
    assert response.headers["x-prefix-cache-template-tokens"] == "0"


def test_a_match_within_the_template_opening_is_cold_not_partial(client, smollm2_tokenizer):
    send(client, body(salt="tmpl"))
    other = send(client, body(system="Completely different instructions.", salt="tmpl"))
    _, layout = chat_prompt(smollm2_tokenizer, body(system="Completely different instructions.")["messages"], None)
    assert layout.template_tokens == 3  # <|im_start|> system \n
    assert other.headers["x-prefix-cache-template-tokens"] == "3"
    assert int(other.headers["x-prefix-cache-matched-tokens"]) == 3
    assert other.headers["x-prefix-cache-miss"] == "cold"
    assert other.json()["prefix_cache"]["divergence"] == {"segment": "system", "char_offset": 0}


def test_every_response_reports_the_engine_s_time_to_first_token(client):
    plain = send(client, body(salt="ttft"))
    ttft_ms = plain.json()["prefix_cache"]["ttft_ms"]
    assert ttft_ms > 0 and float(plain.headers["x-prefix-cache-ttft-ms"]) == pytest.approx(ttft_ms, abs=0.001)
    streamed = client.post(
        "/v1/chat/completions", json={**body(salt="ttft"), "stream": True, "stream_options": {"include_usage": True}}
    )
    usage_chunk = [e for e in sse_events(streamed) if isinstance(e, dict) and e.get("usage")][-1]
    assert usage_chunk["prefix_cache"]["ttft_ms"] > 0
    assert "x-prefix-cache-ttft-ms" not in streamed.headers  # sent before the first token was computed


def test_the_dry_run_match_locates_the_divergence_too(client):
    send(client, body(salt="dry"))
    match = client.post("/v1/cache/match", json=body(system=edit_at(SYSTEM, 200), salt="dry")).json()
    assert match["miss"] == "partial" and match["template_tokens"] == 3
    assert match["divergence"]["segment"] == "system"
    assert 0 <= 200 - match["divergence"]["char_offset"] <= MAX_TOKEN_CHARS


def test_layout_tokens_are_the_prompt_tokens_and_locate_each_part(smollm2_tokenizer):
    messages = body(tools=TOOLS)["messages"]
    token_ids, layout = chat_prompt(smollm2_tokenizer, messages, TOOLS)
    assert token_ids == chat_prompt_token_ids(smollm2_tokenizer, messages, TOOLS)
    assert [span.segment for span in layout.spans] == ["tools", "system", "messages[1]", "messages[2]", "messages[3]"]
    assert layout.template_tokens == 6  # <|im_start|> system \n # Tools \n
    assert layout.locate(layout.template_tokens) == Location("tools", 0)
    assert layout.locate(len(token_ids) - 1) == Location("messages[3]", len("Can I return it?"))
    ids, text_layout = text_prompt(smollm2_tokenizer, "hello world")
    assert text_layout.locate(1) == Location("prompt", 5) and len(ids) == 2


def test_a_template_default_system_prompt_counts_as_template_opening(smollm2_tokenizer):
    token_ids, layout = chat_prompt(smollm2_tokenizer, [{"role": "user", "content": "hi"}], None)
    opening = smollm2_tokenizer.decode(token_ids[: layout.template_tokens])
    assert opening.endswith("<|im_start|>user\n") and "SmolLM" in opening
    assert layout.locate(layout.template_tokens) == Location("messages[0]", 0)
