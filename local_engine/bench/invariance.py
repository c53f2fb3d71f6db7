"""`bench engine`'s batch-invariance sections: whether the cache and the batch change answers, and what invariance
costs.

- The check: each of `prompts` greedy prompts is answered cold, then compared token for token with its answer fully
  cached, partly cached (its first half computed by an earlier request), prefilled 16 tokens a step on a second
  engine, and beside three other requests in flight: four pairs a prompt. It runs on the configured engine (batch
  invariant by default) and on the same engine with `--no-batch-invariant`, whose pairs may differ.
- The cost: output tokens/s at C=1 and C=8 (32 tokens a request, prompts whose system prompt is cached) with and
  without batch invariance, on one engine of each, and the cost as a share of the fast path's tokens/s.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from local_engine.bench.concurrent import build_prompts, measure_concurrency, request_token_ids
from local_engine.bench.engine import system_prompt

SMALL_STEP_TOKENS = 16  # the second engine's --max-num-batched-tokens: long prompts in many small chunks
MAX_TOKENS = 24
COST_CONCURRENCY = (1, 8)
COST_MAX_TOKENS = 32


async def _answer(engine, token_ids: list[int], namespace: str) -> tuple[int, ...]:
    from local_engine.engine.sampling import SamplingParams
    from local_engine.engine.types import GenerationRequest, TokenDelta

    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    handle = await engine.submit(GenerationRequest(tuple(token_ids), sampling, namespace=namespace))
    tokens: list[int] = []
    async for event in handle.stream():
        if isinstance(event, TokenDelta):
            tokens.extend(event.token_ids)
    return tuple(tokens)


async def _pairs(wide, narrow, prompt: list[int], others: list[list[int]], name: str) -> dict[str, bool]:
    """Whether each way of computing `prompt` answers as its cold computation does."""
    cold = await _answer(wide, prompt, f"{name}-cold")
    full = await _answer(wide, prompt, f"{name}-cold")
    await _answer(wide, prompt[: len(prompt) // 2], f"{name}-partial")
    partial = await _answer(wide, prompt, f"{name}-partial")
    small_steps = await _answer(narrow, prompt, f"{name}-small")
    batched, *_ = await asyncio.gather(_answer(wide, prompt, f"{name}-batched"),
                                       *(_answer(wide, other, f"{name}-other-{i}") for i, other in enumerate(others)))
    return {"fully_cached": full == cold, "partly_cached": partial == cold,
            f"prefilled_{SMALL_STEP_TOKENS}_tokens_a_step": small_steps == cold, "batched": batched == cold}


def _check(config, loaded, prompts: list[list[int]], others: list[list[int]]) -> dict:
    from local_engine.engine.engine import Engine

    wide, narrow = Engine(config, loaded), Engine(replace(config, max_num_batched_tokens=SMALL_STEP_TOKENS), loaded)
    wide.start()
    narrow.start()
    try:
        results = [asyncio.run(_pairs(wide, narrow, prompt, others, f"invariance-{i}"))
                   for i, prompt in enumerate(prompts)]
        batch_invariant = wide.runner.batch_invariant
    finally:
        wide.stop()
        narrow.stop()
    unequal: dict[str, int] = {}
    for result in results:
        for way, equal in result.items():
            unequal[way] = unequal.get(way, 0) + (not equal)
    compared = sum(len(result) for result in results)
    return {"batch_invariant": batch_invariant, "pairs_compared": compared,
            "pairs_equal": compared - sum(unequal.values()), "unequal_by_way": unequal}


def run_invariance_check(config, loaded, num_prompts: int, seed: int) -> tuple[dict, dict]:
    """The check on the configured engine and on the fast path; returns (section, verdicts): every pair equal where
    the engine runs batch-invariantly."""
    from local_engine.prompt.chat_prompt import chat_prompt_token_ids

    tokenizer = loaded.tokenizer

    def chat(index: int, length: int) -> list[int]:
        messages = [{"role": "system", "content": system_prompt(tokenizer, 500 + index, length, seed)},
                    {"role": "user", "content": f"Which rule covers case {index}? Answer briefly."}]
        return chat_prompt_token_ids(tokenizer, messages, None)

    prompts = [chat(i, 200 + 150 * (i % 4)) for i in range(num_prompts)]
    others = [chat(100 + i, 60 + 120 * i) for i in range(3)]
    configured = _check(config, loaded, prompts, others)
    fast = _check(replace(config, batch_invariant=False), loaded, prompts, others)
    section = {"configured": configured, "without_batch_invariance": fast}
    verdicts = {}
    if configured["batch_invariant"]:
        equal = configured["pairs_equal"] == configured["pairs_compared"]
        verdicts["batch_invariant_pairs_equal"] = {
            "value": f"{configured['pairs_equal']}/{configured['pairs_compared']}", "target": "all", "pass": equal}
    return section, verdicts


def run_invariance_cost(config, loaded, num_prefixes: int, seed: int) -> dict:
    """Output tokens/s at COST_CONCURRENCY with and without batch invariance, and its cost (1 - invariant / fast)."""
    from local_engine.engine.engine import Engine

    tokenizer = loaded.tokenizer
    prompts = build_prompts(tokenizer, num_prefixes, seed)
    figures: dict[str, dict] = {}
    for label, invariant in (("batch_invariant", True), ("fast", False)):
        engine = Engine(replace(config, batch_invariant=invariant), loaded)
        engine.start()
        try:
            for index in range(len(prompts)):  # the system prompts computed once: the runs measure decode
                asyncio.run(_answer(engine, request_token_ids(tokenizer, prompts, index), "bench-concurrent"))
            figures[label] = {
                f"c{concurrency}": measure_concurrency(engine, tokenizer, prompts, concurrency, COST_MAX_TOKENS,
                                                       max(8, concurrency), 2000)["output_tokens_per_s"]
                for concurrency in COST_CONCURRENCY}
            figures[label]["runs_batch_invariant"] = engine.runner.batch_invariant
        finally:
            engine.stop()
    figures["cost"] = {
        f"c{concurrency}": round(1 - figures["batch_invariant"][f"c{concurrency}"] / figures["fast"][f"c{concurrency}"],
                                 4)
        for concurrency in COST_CONCURRENCY}
    return figures
