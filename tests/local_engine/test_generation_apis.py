"""`n`/`best_of` forked from one prefill, structured outputs beside free requests, prompt log-probabilities: the engine
on a tiny random Llama with SmolLM2's tokenizer."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
import torch

from local_engine.api.choices import ChoiceCollector
from local_engine.engine.types import Finished, GenerationRequest, PromptLogprobs, TokenDelta
from local_engine.engine.sampling import SamplingParams
from local_engine.engine.structured_output import GrammarMasks, response_format_grammar

PROMPT = tuple(range(300, 348))  # 48 tokens
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}},
    "required": ["ok", "color"],
    "additionalProperties": False,
}


async def collect(engine, request: GenerationRequest):
    handle = await engine.submit(request)
    collector = ChoiceCollector(request.sampling.num_sequences)
    async for event in handle.stream():
        collector.add(event)
    return handle.report.result(), collector


def tokens(choice) -> list[int]:
    return [entry.token_id for entry in choice.logprobs]


@pytest.mark.parametrize("config", [{}, {"page_size": 4}, {"prefix_cache": False}],
                         ids=["radix", "page-4", "no-prefix-cache"])
async def test_n_sequences_are_computed_from_one_prefill_each_with_its_own_seed(make_engine, config):
    engine = make_engine(kv_cache_tokens=2048, **config)
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=11, ignore_eos=True, logprobs=0)
    before = engine.counters.prefill_tokens
    _, forked = await collect(engine, GenerationRequest(PROMPT + (1,), replace(params, n=3, best_of=3)))
    assert engine.counters.prefill_tokens - before == len(PROMPT) + 1  # the prompt once, not three times
    engine.check_integrity()
    assert [c.finished.completion_tokens for c in forked.choices] == [6, 6, 6]
    for index, choice in enumerate(forked.choices):
        # Sequence i draws what a lone request seeded with seed + i draws, from the same (shared or copied) KV.
        alone_request = GenerationRequest(PROMPT + (1,), replace(params, seed=11 + index), namespace=f"alone-{index}")
        _, alone = await collect(engine, alone_request)
        assert tokens(choice) == tokens(alone.choices[0])
        assert [e.logprob for e in choice.logprobs] == pytest.approx([e.logprob for e in alone.choices[0].logprobs],
                                                                     abs=1e-4)
    assert len({tuple(tokens(c)) for c in forked.choices}) == 3
    engine.check_integrity()


async def test_best_of_returns_the_n_most_likely_sequences(make_engine):
    engine = make_engine(kv_cache_tokens=2048)
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=3, ignore_eos=True, n=2, best_of=5, logprobs=0)
    _, collector = await collect(engine, GenerationRequest(PROMPT, params))
    scores = sorted((c.finished.cumulative_logprob for c in collector.choices), reverse=True)
    for choice in collector.choices:
        assert choice.finished.cumulative_logprob == pytest.approx(sum(e.logprob for e in choice.logprobs), abs=1e-3)
    best = collector.best(2)
    assert [c.index for c in best] == [0, 1]
    assert [c.finished.cumulative_logprob for c in best] == scores[:2]


async def test_a_cancelled_n_request_releases_every_sequence(make_engine):
    engine = make_engine(kv_cache_tokens=2048)
    handle = await engine.submit(GenerationRequest(PROMPT, SamplingParams(max_tokens=200, temperature=1.0, n=4,
                                                                          ignore_eos=True)))
    seen = 0
    async for event in handle.stream():
        seen += isinstance(event, TokenDelta)
        if seen == 8:
            handle.cancel()
        if isinstance(event, Finished):
            assert event.finish_reason in ("cancelled", "length")
    while engine.scheduler.has_work():
        await asyncio.sleep(0.01)
    engine.check_integrity()


async def test_a_constrained_request_beside_a_free_one_changes_only_itself(make_engine):
    engine = make_engine(kv_cache_tokens=4096)
    free = GenerationRequest(PROMPT, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True), namespace="a")
    _, alone = await collect(engine, free)
    grammar = response_format_grammar({"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA,
                                                                              "strict": True}})
    constrained = GenerationRequest(PROMPT, SamplingParams(max_tokens=40, temperature=1.0, seed=5, grammar=grammar),
                                    namespace="b")
    (_, beside), (_, json_answer) = await asyncio.gather(collect(engine, free), collect(engine, constrained))
    assert beside.choices[0].text == alone.choices[0].text
    answer = json_answer.choices[0]
    assert answer.finished.finish_reason == "stop"
    value = json.loads(answer.text)
    assert set(value) == {"ok", "color"} and isinstance(value["ok"], bool) and value["color"] in SCHEMA[
        "properties"]["color"]["enum"]
    engine.check_integrity()


async def test_prompt_logprobs_are_computed_whole_and_match_a_full_forward(make_engine, tiny_loaded):
    engine = make_engine(kv_cache_tokens=2048, max_num_batched_tokens=16)  # the prompt in three chunks
    await collect(engine, GenerationRequest(PROMPT, SamplingParams(max_tokens=1, temperature=0.0)))  # now cached
    handle = await engine.submit(GenerationRequest(PROMPT, SamplingParams(max_tokens=0, logprobs=2,
                                                                          prompt_logprobs=2)))
    events = [event async for event in handle.stream()]
    assert handle.report.result().matched_tokens == 0  # the cache keeps no logits: the prompt is computed
    (prompt,) = [e for e in events if isinstance(e, PromptLogprobs)]
    assert isinstance(events[-1], Finished) and events[-1].completion_tokens == 0
    assert events[-1].cached_tokens == 0
    with torch.inference_mode():
        reference = torch.log_softmax(tiny_loaded.model(input_ids=torch.tensor([PROMPT])).logits[0].float(), dim=-1)
    assert len(prompt.entries) == len(PROMPT) - 1
    for position, entry in enumerate(prompt.entries, start=1):
        assert entry.token_id == PROMPT[position]
        assert entry.logprob == pytest.approx(reference[position - 1, PROMPT[position]].item(), abs=1e-4)
        assert [t for t, _ in entry.top] == reference[position - 1].topk(2).indices.tolist()
    engine.check_integrity()


async def test_sequences_beyond_max_num_seqs_wait_for_room_and_draw_the_same(make_engine):
    """`n` larger than `--max-num-seqs`: the forks that do not fit wait at the queue's head (their prompt then read
    from the cache), so no step runs more than max_num_seqs sequences, and each draws what it would have drawn."""
    narrow = make_engine(kv_cache_tokens=2048, max_num_seqs=2)
    batch_sizes = []
    run = narrow.runner.run
    narrow.runner.run = lambda chunks: batch_sizes.append(len(chunks)) or run(chunks)
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=4, ignore_eos=True, logprobs=0, n=5, best_of=5)
    _, queued = await collect(narrow, GenerationRequest(PROMPT, params))
    assert max(batch_sizes) == 2
    _, wide = await collect(make_engine(kv_cache_tokens=2048), GenerationRequest(PROMPT, params))
    assert [tokens(c) for c in queued.choices] == [tokens(c) for c in wide.choices]
    assert [c.finished.completion_tokens for c in queued.choices] == [5] * 5
    narrow.check_integrity()


async def test_a_choice_ended_by_eos_carries_the_eos_logprob(make_engine):
    """As vLLM reports it: the EOS token that ends a choice has its entry, the last one."""
    engine = make_engine(kv_cache_tokens=2048)
    eos = min(engine.loaded.eos_token_ids)
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=2, min_tokens=3, logit_bias=((eos, 100.0),))
    _, collector = await collect(engine, GenerationRequest(PROMPT, params))
    (choice,) = collector.choices
    assert choice.finished.finish_reason == "stop" and choice.finished.completion_tokens == 4
    assert len(choice.logprobs) == 4 and choice.logprobs[-1].token_id == eos
    assert choice.finished.cumulative_logprob == pytest.approx(sum(e.logprob for e in choice.logprobs), abs=1e-3)


@pytest.mark.parametrize("constrained_rows", [[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [0, 1, 2, 3], [1, 3, 4]],
                         ids=["every-row", "every-row-reordered", "four-rows", "some-rows"])
def test_grammar_masks_refuse_exactly_the_tokens_a_matcher_disallows(smollm2_tokenizer, monkeypatch,
                                                                     constrained_rows):
    """Every row constrained (masked in place) or some: a constrained row keeps exactly the tokens its matcher
    allows, the others are untouched; on CPU logits the masks are filled one row after another, never by the
    executor's threads, which would wait on torch's spinning OpenMP threads."""
    import llguidance.torch

    masks = GrammarMasks(smollm2_tokenizer, frozenset({smollm2_tokenizer.eos_token_id}))
    grammar = response_format_grammar({"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA,
                                                                              "strict": True}})
    matchers = [masks.matcher(grammar) for _ in constrained_rows]
    for steps, matcher in enumerate(matchers):  # each row at another point of the answer
        for token in smollm2_tokenizer.encode('{"ok":true,"color":"red"}'[: 3 * steps], add_special_tokens=False):
            assert matcher.consume_token(token)
    monkeypatch.setattr(llguidance.torch, "fill_next_token_bitmask_par", None)  # a call would raise
    logits = torch.randn(5, len(smollm2_tokenizer), generator=torch.Generator().manual_seed(3))
    masked = logits.clone()
    masks.apply(masked, list(zip(constrained_rows, matchers)))
    for row in range(5):
        if row not in constrained_rows:
            assert torch.equal(masked[row], logits[row])
            continue
        matcher = matchers[constrained_rows.index(row)]
        allowed = {token for token in range(len(smollm2_tokenizer)) if masked[row, token] != float("-inf")}
        assert allowed and allowed == {token for token in allowed if matcher.validate_tokens([token]) == 1}
        refused = [token for token in range(0, len(smollm2_tokenizer), 97) if token not in allowed]
        assert refused and not any(matcher.validate_tokens([token]) for token in refused)
        assert torch.equal(masked[row, sorted(allowed)], logits[row, sorted(allowed)])
