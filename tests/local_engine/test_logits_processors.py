"""Penalties, logit_bias and min_tokens on hand-made logits rows: each definition, and rows of one batch changed only
by their own request's parameters."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from local_engine.engine.batch_sampling import sample_rows
from local_engine.engine.logits_processors import LogitsAdjuster
from local_engine.engine.sampling import Sampler, SamplingParams

VOCAB = 8
EOS = frozenset({7})
LOGITS = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 1.0, 0.0, 4.0])


def adjusted(params: SamplingParams, prompt=(0, 1), generated=()) -> torch.Tensor:
    adjuster = LogitsAdjuster(params, prompt, EOS, VOCAB)
    row = LOGITS.clone()
    adjuster.apply(row)  # the first apply builds what the penalties read
    for token in generated:
        adjuster.accept(token)
    row = LOGITS.clone()
    adjuster.apply(row)
    return row


def test_frequency_and_presence_penalties_follow_openais_formula():
    params = SamplingParams(max_tokens=8, frequency_penalty=0.5, presence_penalty=1.5)
    row = adjusted(params, generated=(3, 3, 5))
    expected = LOGITS.clone()
    for token, count in ((3, 2), (5, 1)):
        expected[token] -= 0.5 * count + 1.5
    assert torch.equal(row, expected)  # prompt tokens 0 and 1 are not penalized by these two


def test_repetition_penalty_matches_transformers_over_prompt_and_output():
    params = SamplingParams(max_tokens=8, repetition_penalty=1.7)
    row = adjusted(params, prompt=(0, 1), generated=(3, 4))
    reference = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([[0, 1, 3, 4]]), LOGITS.clone().unsqueeze(0))[0]
    assert torch.allclose(row, reference)
    assert row[0].item() == pytest.approx(2.0 / 1.7) and row[1].item() == pytest.approx(-1.7)  # divided, multiplied


def test_logit_bias_adds_and_min_tokens_holds_eos_back():
    params = SamplingParams(max_tokens=8, logit_bias=((2, 100.0), (3, -100.0)), min_tokens=2)
    early = adjusted(params, generated=(5,))
    assert early[2] == 100.5 and early[3] == -97.0
    assert early[7] == -math.inf  # one token generated, two required
    assert adjusted(params, generated=(5, 6))[7] == 4.0


def test_no_adjuster_is_built_for_default_parameters():
    assert not LogitsAdjuster.needed(SamplingParams(max_tokens=4))
    for field, value in (("presence_penalty", 0.1), ("frequency_penalty", -0.1), ("repetition_penalty", 1.1),
                         ("logit_bias", ((1, 1.0),)), ("min_tokens", 1)):
        assert LogitsAdjuster.needed(SamplingParams(max_tokens=4, **{field: value}))


@pytest.mark.parametrize("greedy", [True, False])
def test_rows_in_one_batch_are_changed_by_their_own_request_only(greedy):
    temperature = 0.0 if greedy else 1.0
    biased = SamplingParams(max_tokens=4, temperature=temperature, seed=1, logit_bias=((4, 100.0),))
    plain = SamplingParams(max_tokens=4, temperature=temperature, seed=1)
    samplers = [Sampler(biased, adjuster=LogitsAdjuster(biased, (0,), EOS, VOCAB)), Sampler(plain)]
    logits = torch.stack([LOGITS.clone(), LOGITS.clone()])
    drawn = sample_rows(logits, [[samplers[0]], [samplers[1]]], None)
    assert drawn[0][0].token_id == 4
    alone = sample_rows(LOGITS.clone().unsqueeze(0), [[Sampler(plain)]], None)
    assert drawn[1][0].token_id == alone[0][0].token_id
    assert torch.equal(logits[1], LOGITS)


def test_logprobs_are_the_raw_distribution_before_any_change():
    params = SamplingParams(max_tokens=4, temperature=0.0, logprobs=2, logit_bias=((4, 100.0),))
    drawn = sample_rows(LOGITS.clone().unsqueeze(0), [[Sampler(params, adjuster=LogitsAdjuster(params, (0,), EOS,
                                                                                                VOCAB))]], None)
    raw = torch.log_softmax(LOGITS, dim=-1)
    entry = drawn[0][0].entry
    assert entry.token_id == 4 and entry.logprob == pytest.approx(raw[4].item())
    assert [t for t, _ in entry.top] == [7, 3]  # the model's own two most likely, not the biased token
