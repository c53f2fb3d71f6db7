"""Normalization never costs a verbatim re-send: the default rules applied to a conversation that re-sends the
answer the engine wrote, exactly as returned, never make the engine match less of what it cached.

The seam is the engine's own: turn N goes through the tenant's default pipeline and is rendered into token ids by the
engine's chat prompt code (`local_engine.prompt.chat_prompt`, SmolLM2's tokenizer and template); the engine caches
those ids and the ids of the answer it generated, which its tool-call parser (`local_engine.prompt.tool_calls`) turns
into the message it returns. The gateway remembers that answer's tool calls as the conversation tracker does. Turn
N+1 re-sends it and adds tool results; the engine's match is the common prefix of its prompt ids and what it cached.
"""

from __future__ import annotations

import json
import os
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.anthropic.normalize import normalize as normalize_messages
from gateway.config import SEMANTIC_RULES, TenantSettings
from gateway.conversations.answer import answer_of_message
from gateway.conversations.returned import ReturnedCalls
from gateway.conversations.rewrite import answer_rewrite
from gateway.normalize.pipeline import build_pipeline
from gateway.replicas.request_tokens import RequestTokenizer
from gateway.responses.normalize import normalize as normalize_responses

TENANT = "acme"
DEFAULTS = TenantSettings()  # every default rule, nothing else
PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from local_engine.model.loader import smollm2_directory

    return AutoTokenizer.from_pretrained(
        smollm2_directory(), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", local_files_only=True
    )


def prompt_ids(tokenizer: Any, body: dict[str, Any]) -> list[int]:
    from local_engine.prompt.chat_prompt import chat_prompt_token_ids

    return chat_prompt_token_ids(tokenizer, body["messages"], body.get("tools"))


def prompt_text(tokenizer: Any, body: dict[str, Any]) -> str:
    from local_engine.prompt.chat_prompt import render_chat, template_messages

    return render_chat(tokenizer, template_messages(body["messages"], body.get("tools")))


def returned_message(generated: str, reasoning: str | None) -> dict[str, Any]:
    """The assistant message the engine returns for `generated` (its text), split by its tool-call parser as its
    chat response does; `reasoning` is a separate reasoning field, as reasoning upstreams add."""
    from local_engine.prompt.tool_calls import ToolCallStream, format_for

    stream = ToolCallStream(format_for(None))
    content, calls = stream.feed(generated)
    rest, more = stream.finish()
    content, calls = content + rest, calls + more
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = [call.as_openai() for call in calls]
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def as_resent(message: dict[str, Any], drop_none: bool) -> dict[str, Any]:
    """The message as a client re-sends it: decoded from the response's JSON (the OpenAI SDK's `model_dump`, with
    `exclude_none` or without)."""
    decoded = json.loads(json.dumps(message))
    return {k: v for k, v in decoded.items() if v is not None} if drop_none else decoded


def common_prefix(a: list[int], b: list[int]) -> int:
    return len(os.path.commonprefix([a, b]))


# --- what a conversation holds ----------------------------------------------------------------------------------

_KEY = st.text(alphabet="abcdefgzé_", min_size=1, max_size=5)
_TEXT = st.text(alphabet=string.ascii_letters + " .,:\n\r\t\ufeff\"'{}é<>/", max_size=30)
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-999, 999), st.floats(allow_nan=False, allow_infinity=False,
                                                                           width=32), _TEXT),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(_KEY, children, max_size=4)),
    max_leaves=10,
)
_ARGUMENTS = st.dictionaries(_KEY, _JSON, max_size=5)  # keys in the order the model writes them, nested
_NAME = st.sampled_from(["get_weather", "search", "lookup_order"])
_TOOL = st.builds(
    lambda name, properties, reverse: {
        "type": "function",
        "function": dict(sorted({"name": name, "description": "A tool.", "parameters": {
            "type": "object", "properties": properties}}.items(), reverse=reverse)),
    },
    _NAME, st.dictionaries(_KEY, st.fixed_dictionaries({"type": st.just("string")}), max_size=3), st.booleans(),
)


@st.composite
def generated_answers(draw: Any) -> tuple[str, bool]:
    """(text the engine generated, whether its renderer is expected to write it back exactly): content, tool calls in
    the engine's own format (arguments as it writes them: `json.dumps`, keys in the model's order), or both."""
    from local_engine.prompt.tool_calls.hermes import HermesFormat

    fmt = HermesFormat()
    content = draw(st.one_of(_TEXT, st.builds("<think>{}</think>{}".format, _TEXT, _TEXT)))
    calls = [fmt.open_tag + fmt.body_head(name) + json.dumps(arguments, ensure_ascii=False) + fmt.body_tail
             for name, arguments in draw(st.lists(st.tuples(_NAME, _ARGUMENTS), max_size=3))]
    if not calls:
        return content, True
    # A forced call stops where its JSON closes, before the close tag; several calls sit one a line.
    closed = draw(st.booleans()) or len(calls) > 1
    text = "\n".join(call + fmt.close_tag for call in calls) if closed else calls[0]
    before = draw(st.sampled_from(["", "\n", " "])) if content.strip() else ""
    exact = len(calls) == 1 and (not before or before.isspace()) and "<tool_call>" not in content
    return (content.strip() + before if before else "") + text, exact


_CONVERSATION = st.fixed_dictionaries({
    "system": _TEXT,
    "user": _TEXT,
    "tools": st.lists(_TOOL, max_size=3, unique_by=lambda tool: tool["function"]["name"]),
    "results": st.lists(_TEXT, min_size=1, max_size=2),
})


def _turn(conversation: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "smollm2", "messages": [
        {"role": "system", "content": conversation["system"]}, {"role": "user", "content": conversation["user"]}]}
    if conversation["tools"]:
        body["tools"] = conversation["tools"]
    return body


def _results(message: dict[str, Any], texts: list[str]) -> list[dict[str, Any]]:
    ids = [call["id"] for call in message.get("tool_calls") or ()] or [None]
    if not message.get("tool_calls"):
        return [{"role": "user", "content": texts[0]}]
    return [{"role": "tool", "tool_call_id": ids[i % len(ids)], "content": text} for i, text in enumerate(texts)]


# --- properties ---------------------------------------------------------------------------------------------------


@PROPERTY
@given(_CONVERSATION, generated_answers(), st.one_of(st.none(), _TEXT), st.booleans())
def test_the_default_rules_never_lower_the_match_of_a_verbatim_resend(tokenizer, conversation, answer, reasoning,
                                                                      drop_none):
    generated, exact = answer
    returned = ReturnedCalls(lambda tenant: tenant.encode().ljust(32, b"k"))
    pipeline = build_pipeline(DEFAULTS, returned.lookup_for(TENANT))
    assert pipeline.rule_names == SEMANTIC_RULES
    turn = _turn(conversation)
    sent = pipeline.apply(turn).request  # turn N as the engine got it
    cached = prompt_ids(tokenizer, sent) + tokenizer.encode(generated, add_special_tokens=False)
    message = returned_message(generated, reasoning)
    answer_as_returned = answer_of_message(message)
    returned.remember(TENANT, answer_as_returned.tool_calls, expires_at=float("inf"))  # as the tracker does

    resent = as_resent(message, drop_none)
    tail = _results(message, conversation["results"])
    normalized = pipeline.apply({**turn, "messages": [*turn["messages"], resent, *tail]})
    position = len(sent["messages"])
    # The rules left the answer as it was re-sent; the gateway's record sees no rewrite in it.
    assert normalized.request["messages"][position] == resent
    assert answer_rewrite(answer_as_returned, normalized.request["messages"][position], "m", position) is None
    # The engine's match: never below that of the same request with the answer left alone by construction.
    untouched = {**sent, "messages": [*sent["messages"], resent, *tail]}
    matched = common_prefix(cached, prompt_ids(tokenizer, normalized.request))
    assert matched >= common_prefix(cached, prompt_ids(tokenizer, untouched))
    assert matched >= len(cached) - len(tokenizer.encode(generated, add_special_tokens=False)) - 1
    # The replica router lays the prompt out and encodes it as the engine does (`gateway.replicas.request_tokens`).
    router = RequestTokenizer(tokenizer.backend_tokenizer, tokenizer.chat_template,
                              {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}, "local_engine")
    assert router.prompt_token_ids("chat", normalized.request) == prompt_ids(tokenizer, normalized.request)
    if exact:
        # The engine renders its own answer back as the model wrote it, tool calls included.
        assert prompt_text(tokenizer, normalized.request).startswith(prompt_text(tokenizer, sent) + generated)


def _reserialised(arguments: str, how: int) -> str:
    value = json.loads(arguments)
    if how == 0:
        return json.dumps(value, separators=(",", ":"))  # compact, non-ASCII escaped
    if how == 1:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return json.dumps(dict(reversed(list(value.items()))), indent=1)


@PROPERTY
@given(_CONVERSATION, st.lists(st.tuples(_NAME, _ARGUMENTS), min_size=1, max_size=2, unique_by=lambda call: call[0]),
       st.integers(0, 2))
def test_tool_call_arguments_reserialised_by_the_client_are_sent_as_returned(tokenizer, conversation, calls, how):
    from local_engine.prompt.tool_calls.hermes import HermesFormat

    fmt = HermesFormat()
    generated = "\n".join(fmt.open_tag + fmt.body_head(name) + json.dumps(arguments, ensure_ascii=False)
                          + fmt.body_tail + fmt.close_tag for name, arguments in calls)
    returned = ReturnedCalls(lambda tenant: tenant.encode().ljust(32, b"k"))
    pipeline = build_pipeline(DEFAULTS, returned.lookup_for(TENANT))
    turn = _turn(conversation)
    message = returned_message(generated, None)
    returned.remember(TENANT, answer_of_message(message).tool_calls, expires_at=float("inf"))
    resent = as_resent(message, drop_none=True)
    rewritten = json.loads(json.dumps(resent))
    for call in rewritten["tool_calls"]:
        call["function"]["arguments"] = _reserialised(call["function"]["arguments"], how)
    tail = _results(message, conversation["results"])
    verbatim = pipeline.apply({**turn, "messages": [*turn["messages"], resent, *tail]})
    repaired = pipeline.apply({**turn, "messages": [*turn["messages"], rewritten, *tail]})
    # The gateway writes the calls back as it returned them: the engine sees the verbatim re-send, and the rule that
    # did it is recorded (when the client's text differed at all).
    assert prompt_ids(tokenizer, repaired.request) == prompt_ids(tokenizer, verbatim.request)
    differs = rewritten["tool_calls"] != resent["tool_calls"]
    assert ("tool_call_arguments_key_order" in repaired.applied_rules) == differs
    assert "tool_call_arguments_key_order" not in verbatim.applied_rules


_ANTHROPIC_ANSWER = st.builds(
    lambda text, name, arguments: {"role": "assistant", "content": [
        {"type": "text", "text": text}, {"type": "tool_use", "id": "toolu_1", "name": name, "input": arguments}]},
    _TEXT, _NAME, _ARGUMENTS,
)


@settings(max_examples=80, deadline=None)
@given(_ANTHROPIC_ANSWER, _TEXT, st.lists(_TOOL, max_size=3))
def test_the_messages_and_responses_rules_leave_answers_as_returned(answer, text, tools):
    messages = {"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": text}, answer,
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": text}]}]}
    normalized, _ = normalize_messages(messages, DEFAULTS)
    assert normalized["messages"][1] is answer
    call = {"type": "function_call", "call_id": "c", "name": answer["content"][1]["name"],
            "arguments": json.dumps(answer["content"][1]["input"], separators=(",", ":"))}
    said = {"role": "assistant", "content": [{"type": "output_text", "text": answer["content"][0]["text"]}]}
    responses = {"model": "m", "input": [{"role": "user", "content": text}, said, call,
                                         {"type": "function_call_output", "call_id": "c", "output": text}]}
    normalized, _ = normalize_responses(responses, DEFAULTS)
    assert normalized["input"][1] is said and normalized["input"][2] is call
