"""`prefixscope bench engine`'s API sections: what constrained decoding costs, and what forking `n` sequences from
one prefill saves.

- Constrained decoding: the same requests with and without a JSON-schema grammar, C at a time (C = 1 and 8), every
  request generating exactly `max_tokens` tokens (the schema asks for a long array, the unconstrained runs ignore
  EOS). Each side's prompt is cached before the rounds, so a run is decode steps after one short prefill (a fresh
  2k-token prefill in every run took more time than the decoding measured, and its spread hid the grammar's cost).
  Rounds alternate between the two so a change in machine load hits both. Target: constrained tokens/s at least 90%
  of unconstrained.
- `n = 4`: one request with n=4 against 4 requests of the same prompt sent together (each in a fresh cache
  namespace, so none reuses another's prefill). Target: n=4 at least 2x faster.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import replace

from local_engine.engine.types import Finished, GenerationRequest
from local_engine.engine.sampling import SamplingParams
from local_engine.engine.structured_output import response_format_grammar

# A JSON value that cannot end before max_tokens: the schema asks for more numbers than fit.
LONG_ARRAY_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "numbers", "strict": True, "schema": {
        "type": "object",
        "properties": {"numbers": {"type": "array", "items": {"type": "integer"}, "minItems": 10000}},
        "required": ["numbers"],
        "additionalProperties": False,
    }},
}


async def _run(engine, requests: list[GenerationRequest]) -> tuple[float, int, list[Finished]]:
    """Submit all at once; (wall seconds, completion tokens, every Finished)."""
    started = time.perf_counter()

    async def one(request: GenerationRequest) -> list[Finished]:
        handle = await engine.submit(request)
        return [event async for event in handle.stream() if isinstance(event, Finished)]

    ends = [end for ends in await asyncio.gather(*(one(r) for r in requests)) for end in ends]
    return time.perf_counter() - started, sum(end.completion_tokens for end in ends), ends


async def _constrained_cost(engine, prompt: tuple[int, ...], concurrency: int, max_tokens: int, rounds: int) -> dict:
    grammar = response_format_grammar(LONG_ARRAY_FORMAT)
    free = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    constrained = SamplingParams(max_tokens=max_tokens, temperature=0.0, grammar=grammar)
    rates: dict[str, list[float]] = {"unconstrained": [], "constrained": []}
    sides = (("unconstrained", free), ("constrained", constrained))
    for label, params in sides:  # warm-up: the prompt cached on each side, the grammar tokenizer built once
        await _run(engine, [GenerationRequest(prompt, params, namespace=f"bench-{label}")])
    for _ in range(rounds):
        for label, params in sides:
            requests = [GenerationRequest(prompt, params, namespace=f"bench-{label}") for _ in range(concurrency)]
            seconds, tokens, ends = await _run(engine, requests)
            if any(end.completion_tokens != max_tokens for end in ends):
                raise RuntimeError(f"a {label} request ended before max_tokens")
            rates[label].append(tokens / seconds)
    free_rate = statistics.median(rates["unconstrained"])
    constrained_rate = statistics.median(rates["constrained"])
    return {
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "rounds": rounds,
        "unconstrained_tokens_per_s": round(free_rate, 1),
        "constrained_tokens_per_s": round(constrained_rate, 1),
        "slowdown": round(1 - constrained_rate / free_rate, 4),
    }


async def _fork_speedup(engine, prompt: tuple[int, ...], max_tokens: int, rounds: int) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=7, ignore_eos=True)
    forked, separate = [], []
    prefill_tokens = {}
    for round_index in range(rounds):
        before = engine.counters.prefill_tokens
        seconds, _, _ = await _run(engine, [GenerationRequest(prompt, replace(params, n=4, best_of=4),
                                                              namespace=f"bench-n4-{round_index}")])
        forked.append(seconds)
        prefill_tokens["n4"] = engine.counters.prefill_tokens - before
        before = engine.counters.prefill_tokens
        seconds, _, _ = await _run(engine, [GenerationRequest(prompt, params, namespace=f"bench-sep-{round_index}-{i}")
                                            for i in range(4)])
        separate.append(seconds)
        prefill_tokens["separate"] = engine.counters.prefill_tokens - before
    forked_s, separate_s = statistics.median(forked), statistics.median(separate)
    return {
        "prompt_tokens": len(prompt),
        "max_tokens": max_tokens,
        "rounds": rounds,
        "n4_seconds": round(forked_s, 3),
        "four_requests_seconds": round(separate_s, 3),
        "prefill_tokens_n4": prefill_tokens["n4"],
        "prefill_tokens_four_requests": prefill_tokens["separate"],
        "speedup": round(separate_s / forked_s, 2),
    }


def run_apis_workload(engine, prompt_ids: tuple[int, ...], fork_prompt_ids: tuple[int, ...], rounds: int = 3,
                      max_tokens: int = 32) -> tuple[dict, dict]:
    """(report section, verdicts). `engine` is started and stopped by the caller."""

    async def run() -> dict:
        return {
            "constrained_decoding": [await _constrained_cost(engine, prompt_ids, c, max_tokens, rounds) for c in (1, 8)],
            "n4_vs_four_requests": await _fork_speedup(engine, fork_prompt_ids, 16, rounds),
        }

    section = asyncio.run(run())
    verdicts = {}
    for row in section["constrained_decoding"]:
        verdicts[f"constrained_decoding_slowdown_c{row['concurrency']}"] = {
            "value": row["slowdown"], "target": "<= 0.10", "pass": row["slowdown"] <= 0.10}
    speedup = section["n4_vs_four_requests"]["speedup"]
    verdicts["n4_speedup_vs_four_requests"] = {"value": speedup, "target": ">= 2.0", "pass": speedup >= 2.0}
    return section, verdicts
