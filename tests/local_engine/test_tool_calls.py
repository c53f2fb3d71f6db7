"""The Hermes `<tool_call>` parser and the streaming splitter of content and calls."""

from __future__ import annotations

import json

import pytest

from local_engine.prompt.tool_calls import ToolCallStream, format_for
from local_engine.prompt.tool_calls.hermes import HermesFormat

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'


def run(stream: ToolCallStream, text: str, size: int):
    content, calls = [], []
    for start in range(0, len(text), size):
        piece, done = stream.feed(text[start : start + size])
        content.append(piece)
        calls += done
    piece, done = stream.finish()
    return "".join(content) + piece, calls + done


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_a_call_between_text_is_split_out_whatever_the_chunking(size):
    content, calls = run(ToolCallStream(HermesFormat()), "Let me check. " + CALL + " Done.", size)
    assert content == "Let me check.  Done."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert calls[0].id.startswith("call_") and len(calls[0].id) == 29


def test_two_calls_and_text_that_only_looks_like_a_tag():
    text = "a <tool b " + CALL + "\n" + CALL.replace("Oslo", "Rome")
    content, calls = run(ToolCallStream(HermesFormat()), text, 2)
    assert content == "a <tool b \n"
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Oslo", "Rome"]
    assert len({c.id for c in calls}) == 2


def test_a_call_that_is_not_json_stays_content():
    content, calls = run(ToolCallStream(HermesFormat()), "<tool_call>not json</tool_call>", 4)
    assert (content, calls) == ("<tool_call>not json", [])


def test_an_unclosed_but_complete_call_at_the_end_is_a_call():
    content, calls = run(ToolCallStream(HermesFormat()), '<tool_call>{"name": "f", "arguments": {}}', 5)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("f", "{}")]


def test_a_forced_opening_is_parsed_but_never_shown():
    fmt = HermesFormat()
    opening = fmt.opening("get_weather")
    assert opening == '<tool_call>{"name": "get_weather", "arguments": '
    assert fmt.opening(None) == '<tool_call>{"name": "'  # the model writes the name
    stream = ToolCallStream(fmt, opening, forced_name="get_weather")
    content, calls = run(stream, '{"city": "Paris"}}\n\nThe weather in Paris is nice.', 3)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_a_forced_call_with_broken_arguments_keeps_the_name_and_json_arguments():
    stream = ToolCallStream(HermesFormat(), '<tool_call>{"name": "f", "arguments": {', forced_name="f")
    _, calls = run(stream, '"x": 1,, }', 100)
    assert [(c.name, c.arguments) for c in calls] == [("f", "{}")]


def test_a_call_cut_short_by_max_tokens_is_completed():
    stream = ToolCallStream(HermesFormat(), '<tool_call>{"name": "f", "arguments": {"city": ', forced_name="f")
    _, calls = run(stream, '"Paris, Fr', 4)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"city": "Paris, Fr"})]


def test_the_format_is_chosen_from_the_chat_template(smollm2_tokenizer):
    class QwenLike:
        chat_template = "{% for m in messages %}<tool_call>{% endfor %}"

    assert isinstance(format_for(QwenLike()), HermesFormat)
    # SmolLM2's template has no tool support: the engine renders earlier calls in the Hermes format itself.
    assert isinstance(format_for(smollm2_tokenizer), HermesFormat)


def test_a_call_cut_short_by_max_tokens_finishes_with_length_not_tool_calls():
    from local_engine.engine.types import Finished, RequestTimings
    from local_engine.api.responses import _finish_reason

    timings = RequestTimings(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    _, cut = run(ToolCallStream(HermesFormat()), CALL[:50], 5)
    assert cut and not cut[0].complete  # completed from partial JSON
    assert _finish_reason(Finished("length", 10, 4, 0, timings), cut) == "length"
    # Whole JSON, then the model kept writing until max_tokens without closing the tag: the call is whole.
    _, whole = run(ToolCallStream(HermesFormat()), CALL.removesuffix("</tool_call>") + " and then", 5)
    assert whole and whole[0].complete
    assert _finish_reason(Finished("length", 10, 4, 0, timings), whole) == "tool_calls"
    assert _finish_reason(Finished("stop", 10, 4, 0, timings), cut) == "tool_calls"
    assert _finish_reason(Finished("stop", 10, 4, 0, timings), []) == "stop"


@pytest.mark.parametrize(
    ("opened", "generated", "closed_at"),
    [
        ('{"a": {"city": ', '"Paris"}}\nThe weather is nice.', len('"Paris"}}')),
        ('{"a": {"city": "', 'Pa}ri{s"}} and more }', len('Pa}ri{s"}}')),  # brackets inside a string don't count
        ('{"a": {"city": "', 'say \\"}}\\" twice"}}x', len('say \\"}}\\" twice"}}')),  # nor do escaped quotes
        ('{"a": [', '1, [2, 3]]}]', len("1, [2, 3]]}")),
        ('{"a": {"city": ', '"Par', None),
    ],
)
def test_the_json_closer_finds_where_the_opened_value_closes(opened, generated, closed_at):
    from local_engine.prompt.json_closer import JsonCloser

    assert JsonCloser(opened).feed(generated) == closed_at
    closer = JsonCloser(opened)  # fed a character at a time, it closes at the same place
    positions = [i + 1 for i, char in enumerate(generated) if closer.feed(char) is not None]
    assert positions[:1] == ([] if closed_at is None else [closed_at])


def test_a_forced_call_ends_where_its_json_closes(smollm2_tokenizer):
    """The model closes the call's JSON and writes on: the text ends at the close, as at a stop string."""
    from local_engine.prompt.detokenizer import IncrementalDetokenizer

    opening = HermesFormat().opening("get_weather")
    detokenizer = IncrementalDetokenizer(smollm2_tokenizer, ("</tool_call>",), HermesFormat().opened_json(opening))
    pieces = []
    for token_id in smollm2_tokenizer.encode('{"city": "Paris"}}\n\nThe weather in Paris is nice.</tool_call>'):
        pieces.append(detokenizer.feed(token_id))
        if detokenizer.stopped:
            break
    assert "".join(pieces) == detokenizer.text == '{"city": "Paris"}}'
    assert detokenizer.matched_stop is None
    _, calls = run(ToolCallStream(HermesFormat(), opening, forced_name="get_weather"), detokenizer.text, 4)
    assert [(c.name, json.loads(c.arguments), c.complete) for c in calls] == [("get_weather", {"city": "Paris"}, True)]


def test_a_named_tool_choice_sets_up_the_opening_and_the_json_close(tiny_loaded):
    from local_engine.api.protocol import CHAT, parse_request

    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [tool],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 8}
    parsed = parse_request(body, CHAT, tiny_loaded)
    assert parsed.tool_opening == '<tool_call>{"name": "get_weather", "arguments": '  # the grammar writes the rest
    assert parsed.sampling.closing_json == '{"name": "get_weather", "arguments": '
    assert parse_request({**body, "tool_choice": "auto"}, CHAT, tiny_loaded).sampling.closing_json == ""


def test_required_with_several_tools_leaves_the_name_to_the_grammar_and_one_tool_is_named(tiny_loaded):
    from local_engine.api.protocol import CHAT, parse_request

    def tool(name):
        return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}

    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
            "tools": [tool("a_tool"), tool("b_tool")], "tool_choice": "required"}
    several = parse_request(body, CHAT, tiny_loaded)
    assert several.tool_opening == '<tool_call>{"name": "' and several.sampling.grammar is not None
    one = parse_request({**body, "tools": [tool("a_tool")]}, CHAT, tiny_loaded)
    assert one.tool_opening == '<tool_call>{"name": "a_tool", "arguments": '  # named in the opening instead
    assert one.tool_choice.function == "a_tool"
    named = parse_request({**body, "tool_choice": {"type": "function", "function": {"name": "b_tool"}}}, CHAT,
                          tiny_loaded)
    assert named.tool_opening == '<tool_call>{"name": "b_tool", "arguments": '


def test_sampled_forced_calls_on_a_random_model_name_a_real_tool(make_engine):
    """The tiny random model writes noise; under the grammar its forced calls still name one of the tools."""
    import asyncio

    from local_engine.engine.types import GenerationRequest
    from local_engine.api.protocol import CHAT, parse_request

    from .conftest import run_to_end

    engine = make_engine(kv_cache_tokens=4096)
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
             for name in ("get_weather", "roll_dice", "create_user")]
    names = set()
    for seed in range(6):
        body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Do something"}], "tools": tools,
                "tool_choice": "required", "max_tokens": 12, "seed": seed}
        parsed = parse_request(body, CHAT, engine.loaded)
        _, text, _ = asyncio.run(run_to_end(engine, GenerationRequest(parsed.prompt_token_ids, parsed.sampling)))
        name = text.split('"')[0]
        assert name in {"get_weather", "roll_dice", "create_user"}, text
        names.add(name)
    assert names


def test_a_raw_newline_inside_an_argument_string_is_kept_not_dropped():
    stream = ToolCallStream(HermesFormat(), '<tool_call>{"name": "f", "arguments": {"city": "', forced_name="f")
    _, calls = run(stream, 'New\nYork"}}', 3)
    assert [(c.name, json.loads(c.arguments), c.complete) for c in calls] == [("f", {"city": "New\nYork"}, True)]
    assert "\n" not in calls[0].arguments  # escaped in the JSON string returned
