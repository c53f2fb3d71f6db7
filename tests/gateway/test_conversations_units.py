"""Linking requests into conversations: explicit ids by precedence, linking by content, tenant isolation, expiry,
memory bounds, and each kind of answer rewrite with its segment and character offset."""

from __future__ import annotations

import json

import pytest

from gateway.config.tenant import TenantSettings
from gateway.conversations.answer import MessageCapture, PlainCapture, StreamCapture
from gateway.conversations.ids import ExplicitId, explicit_id
from gateway.conversations.link import CONVERSATION_FIELDS
from gateway.conversations.rewrite import segment_text
from gateway.conversations.tracker import ConversationTracker
from gateway.explain.explainer import ExplainContext, Explainer
from gateway.explain.segments import chat_segments
from gateway.parsing import CHAT

SYSTEM = {"role": "system", "content": "You are terse."}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def keys(tenant: str) -> bytes:
    return tenant.encode().ljust(32, b"\0")


class Gateway:
    """The explainer with a conversation tracker, driven as the request path drives it."""

    def __init__(self, **bounds) -> None:
        self.clock = Clock()
        self.tracker = ConversationTracker(keys, clock=self.clock, **bounds)
        self.explainer = Explainer(None, conversations=self.tracker)  # type: ignore[arg-type]
        self.count = 0

    def send(self, messages, answer=None, *, tenant="acme", explicit=None, retention="5m", model="m", status=200,
             recorded_status=None):
        self.count += 1
        settings = TenantSettings(max_cache_retention=retention)
        body = {"model": model, "messages": messages}
        context = ExplainContext(settings, CHAT, tenant, body, body, "salt", None, False, explicit_id=explicit)
        context.request_id = f"req_{self.count}"
        self.explainer.prepare(context)
        context.upstream_status = status
        if answer is not None:
            context.answer = MessageCapture(answer if isinstance(answer, dict) else {"role": "assistant",
                                                                                     "content": answer})
        recorded = recorded_status if recorded_status is not None else (status if status is not None else 502)
        return self.explainer.conversation(context, recorded_status=recorded)


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


@pytest.mark.parametrize(
    ("header", "body", "expected"),
    [
        ("s1", {"prompt_cache_key": "k", "metadata": {"session_id": "m"}, "user": "u"}, ExplicitId("header", "s1")),
        (None, {"prompt_cache_key": "k", "metadata": {"session_id": "m"}}, ExplicitId("prompt_cache_key", "k")),
        ("", {"metadata": {"conversation_id": "c", "user_id": "a"}, "user": "u"}, ExplicitId("metadata", "c")),
        (None, {"metadata": {"user_id": "a"}, "user": "u"}, ExplicitId("metadata", "a")),
        (None, {"prompt_cache_key": 3, "user": "u"}, ExplicitId("user", "u")),
        (None, {"user": " "}, None),
    ],
)
def test_explicit_ids_by_precedence(header, body, expected):
    assert explicit_id(header, body) == expected


def test_explicit_conversations_count_turns_and_are_keyed_per_tenant():
    gateway = Gateway()
    session = ExplicitId("header", "chat-42")
    first = gateway.send([user("a")], "x", explicit=session)
    second = gateway.send([user("b")], "y", explicit=session)  # an unrelated prompt: the id links it
    other_tenant = gateway.send([user("a")], "x", tenant="globex", explicit=session)
    assert (first.source, first.turn_index, first.parent_request_id) == ("header", 1, None)
    assert (second.turn_index, second.parent_request_id) == (2, "req_1")
    assert second.conversation_id == first.conversation_id and "chat-42" not in first.conversation_id
    assert second.new_from_segment is None  # it does not extend its parent's prompt
    assert other_tenant.turn_index == 1 and other_tenant.conversation_id != first.conversation_id


def test_linking_by_content_over_three_turns():
    gateway = Gateway()
    first = gateway.send([SYSTEM, user("hi")], "Hello.")
    gateway.clock.now += 12.5
    second = gateway.send([SYSTEM, user("hi"), assistant("Hello."), user("more")], "More.")
    third = gateway.send([SYSTEM, user("hi"), assistant("Hello."), user("more"), assistant("More."), user("end")])
    unrelated = gateway.send([SYSTEM, user("other")], "Other.")
    assert (first.source, first.turn_index) == ("content", 1)
    assert (second.conversation_id, second.turn_index, second.parent_request_id) == (first.conversation_id, 2, "req_1")
    assert second.idle_s == pytest.approx(12.5) and second.new_from_segment == 4  # model, system, user, answer
    assert second.answer_rewrite is None
    assert (third.conversation_id, third.turn_index, third.parent_request_id) == (first.conversation_id, 3, "req_2")
    assert unrelated.turn_index == 1 and unrelated.conversation_id != first.conversation_id
    assert second.record_fields()["conversation_source"] == "content"


def test_another_tenant_never_links_and_the_model_may_change():
    gateway = Gateway()
    first = gateway.send([user("hi")], "Hello.")
    elsewhere = gateway.send([user("hi"), assistant("Hello."), user("more")], tenant="globex")
    other_model = gateway.send([user("hi"), assistant("Hello."), user("more")], model="m2")
    assert elsewhere.turn_index == 1 and elsewhere.conversation_id != first.conversation_id
    assert (other_model.turn_index, other_model.conversation_id) == (2, first.conversation_id)


def test_turns_expire_with_the_longest_retention_class():
    gateway = Gateway()
    gateway.send([user("hi")], "Hello.", retention="5m")
    gateway.clock.now += 301
    late = gateway.send([user("hi"), assistant("Hello."), user("more")])
    gateway.send([user("yo")], "Yo.", retention="1h")
    gateway.clock.now += 3000
    in_time = gateway.send([user("yo"), assistant("Yo."), user("more")])
    assert late.turn_index == 1 and in_time.turn_index == 2
    assert len(gateway.tracker) == 2  # the two 5m turns were forgotten; the 1h one and its follower remain


def test_memory_is_bounded_per_tenant_overall_and_in_answer_characters():
    per_tenant = Gateway(max_turns_per_tenant=2)
    for word in ("a", "b", "c"):
        per_tenant.send([user(word)], word.upper())
    assert per_tenant.send([user("a"), assistant("A"), user("x")]).turn_index == 1  # the oldest was forgotten
    assert per_tenant.send([user("c"), assistant("C"), user("x")]).turn_index == 2
    overall = Gateway(max_turns=2)
    for tenant in ("t1", "t2", "t3"):
        overall.send([user("a")], "A", tenant=tenant)
    assert len(overall.tracker) == 2
    assert overall.send([user("a"), assistant("A"), user("x")], tenant="t1").turn_index == 1
    chars = Gateway(max_answer_chars=10)
    chars.send([user("a")], "12345678")
    chars.send([user("b")], "12345678")
    assert chars.tracker.answer_chars <= 10
    assert chars.send([user("a"), assistant("1234567"), user("x")]).turn_index == 1


TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.mark.parametrize(
    ("returned", "resent", "kind", "offset"),
    [
        ("Line one.\n\nLine two.", assistant("Line one.\nLine two."), "whitespace", 10),
        ("<think>Short.</think>\n\nHello.", assistant("Hello."), "reasoning_stripped", 0),
        ("Hello there, world.", assistant("Hello there"), "truncated", 11),
        ("Hello there, world.", assistant("Hello, world."), "edited", 5),
        (
            {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
            {"role": "assistant", "content": None, "tool_calls": [
                {**TOOL_CALL, "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
            "tool_arguments",
            None,
        ),
    ],
)
def test_each_answer_rewrite_with_its_segment_and_offset(returned, resent, kind, offset):
    gateway = Gateway()
    first = gateway.send([SYSTEM, user("hi")], returned)
    messages = [SYSTEM, user("hi"), resent, user("next")]
    second = gateway.send(messages, "ok")
    assert second.turn_index == 2 and second.conversation_id == first.conversation_id  # still linked
    rewrite = second.answer_rewrite
    text = chat_segments({"model": "m", "messages": messages}).segments[3].text
    assert text == segment_text(resent)  # the offsets' text is the segment's
    if offset is None:  # in the message's JSON: where the arguments' text first differs
        offset = text.index('{\\"city\\":') + len('{\\"city\\":')
    assert (rewrite.kind, rewrite.segment, rewrite.segment_index, rewrite.char_offset) == (
        kind, "messages[2]", 3, offset,
    )
    assert second.record_fields()["answer_rewrite"] == kind


def test_an_answer_re_sent_as_returned_is_not_a_rewrite():
    gateway = Gateway()
    gateway.send([user("hi")], {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]})
    resent = {"role": "assistant", "tool_calls": [TOOL_CALL], "content": ""}
    link = gateway.send([user("hi"), resent, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    assert link.turn_index == 2 and link.answer_rewrite is None


def test_captures_read_plain_and_streamed_answers():
    body = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi."}}]}).encode()
    assert PlainCapture(body).answer().content == "Hi."
    stream = StreamCapture()
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "He"}}]},
        {"choices": [{"index": 0, "delta": {"content": "llo"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"a":'}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}}]},
        {"choices": [], "usage": {"prompt_tokens": 3}},
    ]
    data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    stream.add(data[:17])
    stream.add(data[17:])
    answer = stream.answer()
    assert answer.content == "Hello" and [(c.name, c.arguments) for c in answer.tool_calls] == [("f", '{"a": 1}')]


def test_a_request_prepared_before_its_parent_was_answered_links_when_finished():
    gateway = Gateway()
    settings = TenantSettings()
    body = {"model": "m", "messages": [user("hi"), assistant("Hello."), user("more")]}
    child = ExplainContext(settings, CHAT, "acme", body, body, "salt", None, False)
    child.request_id = "req_child"
    gateway.explainer.prepare(child)  # its parent is not answered yet
    first = gateway.send([user("hi")], "Hello.")
    child.upstream_status = 200
    link = gateway.explainer.conversation(child, recorded_status=200)
    assert (link.conversation_id, link.turn_index) == (first.conversation_id, 2)


@pytest.mark.parametrize(("status", "recorded"), [(None, 400), (None, 502), (500, 500), (429, 429), (200, 499)])
def test_a_request_not_answered_with_a_2xx_is_no_turn(status, recorded):
    """Refused by the gateway (no upstream status), failed upstream, or cut before the answer reached the client:
    no conversation link, and the conversation goes on from the turn before, by id and by content."""
    gateway = Gateway()
    session = ExplicitId("header", "chat-9")
    first = gateway.send([user("a")], "x", explicit=session)
    failed = gateway.send([user("b")], "y", explicit=session, status=status, recorded_status=recorded)
    second = gateway.send([user("c")], "z", explicit=session)
    assert failed is None
    assert (second.conversation_id, second.turn_index, second.parent_request_id) == (first.conversation_id, 2, "req_1")
    opening = gateway.send([SYSTEM, user("hi")], "Hello.", status=status, recorded_status=recorded)
    follow_up = gateway.send([SYSTEM, user("hi"), assistant("Hello."), user("more")], "More.")
    assert opening is None and (follow_up.turn_index, follow_up.parent_request_id) == (1, None)


def test_the_declared_conversation_fields_are_the_link_s():
    link = Gateway().send([user("hi")], "Hello.")
    assert tuple(link.record_fields()) == CONVERSATION_FIELDS
