"""Conversations through the gateway in front of the stub upstream, driven by the official `openai` and `anthropic`
packages: explicit ids (the session header over chat completions, keyed per tenant; `prompt_cache_key`, read before
the gateway replaces it; the Messages API's `metadata.user_id`), and the Responses API linked by content, plain and
streamed, with the answer the gateway returned re-sent through `previous_response_id`; and an `anthropic` upstream's
answers (passthrough), plain and streamed, re-sent as returned and with their whitespace changed."""

from __future__ import annotations

import anthropic
import openai
from anthropic_stub import AnthropicStub
from gateway_testkit import FakeStorage, gateway_config, running_gateway, serve_in_thread

from gateway.config import UpstreamConfig


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)


def test_session_header_and_responses_by_content(stub, stub_url):
    storage = FakeStorage()
    keys = {tenant: storage.add_key(f"k-{tenant}", tenant) for tenant in ("acme", "beta")}
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:
        session = {"x-prefixscope-session": "chat-7"}
        for tenant, question in (("acme", "a"), ("acme", "b"), ("beta", "a")):
            _client(gw.url, keys[tenant]).chat.completions.create(
                model="m", messages=[{"role": "user", "content": question}], extra_headers=session, user="u1"
            )
        acme = _client(gw.url, keys["acme"])
        first = acme.responses.create(model="m", input="Hi there")
        second = acme.responses.create(model="m", input="More", previous_response_id=first.id, stream=True)
        second_id = next(event.response.id for event in second if event.type == "response.completed")
        acme.responses.create(model="m", input="Bye", previous_response_id=second_id)
        for question in ("a", "b"):
            acme.chat.completions.create(
                model="m", messages=[{"role": "user", "content": question}], prompt_cache_key="pk-1", user="u1"
            )
        messages = anthropic.Anthropic(base_url=gw.url, api_key=keys["acme"], max_retries=0, timeout=30).messages
        messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "Hi"}],
                        metadata={"user_id": "u-9"})
        records = gw.wait_records(9)
    header = records[:3]
    assert [(r.conversation_source, r.turn_index) for r in header] == [("header", 1), ("header", 2), ("header", 1)]
    assert header[0].conversation_id == header[1].conversation_id != header[2].conversation_id
    assert "chat-7" not in header[0].conversation_id and header[1].parent_request_id == header[0].request_id
    responses = records[3:6]
    assert [(r.conversation_source, r.turn_index) for r in responses] == [("content", i) for i in (1, 2, 3)]
    assert len({r.conversation_id for r in responses}) == 1
    assert [r.parent_request_id for r in responses] == [None, responses[0].request_id, responses[1].request_id]
    assert [r.answer_rewrite for r in responses[:3]] == [None, None, None]  # the stored answers, re-sent as returned
    keyed, metadata = records[6:8], records[8]
    assert [(r.conversation_source, r.turn_index) for r in keyed] == [("prompt_cache_key", 1), ("prompt_cache_key", 2)]
    assert (metadata.conversation_source, metadata.turn_index) == ("metadata", 1)


def test_anthropic_passthrough_answers_round_trip(tmp_path):
    """An `anthropic` upstream's answer, plain and streamed, is captured as sent and compared when re-sent."""
    stub = AnthropicStub()  # answers "Hi there", plain or streamed
    with serve_in_thread(stub) as url:
        upstream = UpstreamConfig(name="claude", url=url, kind="anthropic", api_key="sk-upstream", timeout_s=30)
        with running_gateway(gateway_config(url, upstreams=(upstream,), default_upstream="claude")) as gw:
            messages = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0, timeout=30).messages
            turns = [{"role": "user", "content": "Hi"}]
            messages.create(model="claude-x", max_tokens=8, messages=turns)
            turns += [{"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "More"}]
            with messages.stream(model="claude-x", max_tokens=8, messages=turns) as stream:
                stream.until_done()
            turns += [{"role": "assistant", "content": [{"type": "text", "text": "Hi  there"}]},
                      {"role": "user", "content": "Bye"}]
            messages.create(model="claude-x", max_tokens=8, messages=turns)
            records = gw.wait_records(3)
    assert [r.turn_index for r in records] == [1, 2, 3] and len({r.conversation_id for r in records}) == 1
    assert [r.answer_rewrite for r in records] == [None, None, "whitespace"]
    assert (records[2].answer_rewrite_segment, records[2].answer_rewrite_char_offset) == ("messages[3]", 3)


def test_a_refused_request_is_no_conversation_turn(stub, stub_url):
    """Requests the upstream refused (its 400, as for `user=12345`, and a 429) are recorded without conversation
    fields, by id and by content; the session's next answered request is its first turn."""
    with running_gateway(gateway_config(stub_url)) as gw:
        client = _client(gw.url, "k")
        session = {"x-prefixscope-session": "chat-8"}
        for model, headers in (("err-400", session), ("err-429", None)):
            try:
                client.chat.completions.create(model=model, messages=[{"role": "user", "content": "a"}],
                                               extra_headers=headers)
            except (openai.BadRequestError, openai.RateLimitError):
                pass
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}], extra_headers=session)
        *refused, answered = gw.wait_records(3)
    assert [r.status_code for r in refused] == [400, 429]
    for record in refused:
        assert (record.conversation_id, record.conversation_source, record.turn_index) == (None, None, None)
    assert (answered.conversation_source, answered.turn_index, answered.parent_request_id) == ("header", 1, None)
