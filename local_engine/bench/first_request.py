"""`prefixscope bench engine`'s first-request figure: the time to first token of the first request after the engine is
ready, against later misses of the same length, on an engine warmed up as `prefixscope engine` warms it
(local_engine.engine.warm_up).

It must run before anything else in the process has run the model: what the warm-up is there for (kernels built for
a shape, the grammar tokenizer, thread pools) is paid once per process, so any earlier section would pay it instead.
"""

from __future__ import annotations

import asyncio
import statistics

LATER_MISSES = 3  # later misses whose median the first request is compared with
TARGET = 1.5  # the first request's TTFT over the later misses' median, at most


def same_length_prompts(prompts: list[list[int]]) -> list[tuple[int, ...]]:
    """The prompts cut to the shortest one's length, so every request prefills the same number of tokens."""
    length = min(len(prompt) for prompt in prompts)
    return [tuple(prompt[:length]) for prompt in prompts]


async def _ttfts(engine, prompts: list[tuple[int, ...]]) -> list[float]:
    from local_engine.engine.sampling import SamplingParams
    from local_engine.engine.types import Finished, GenerationRequest

    sampling = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    ttfts = []
    for index, prompt in enumerate(prompts):
        # Each in its own namespace: every one is a miss, whatever the prompts share.
        handle = await engine.submit(GenerationRequest(prompt, sampling, namespace=f"first-request-{index}"))
        async for event in handle.stream():
            if isinstance(event, Finished):
                ttfts.append(event.timings.ttft_ms)
    return ttfts


def run_first_request(config, loaded, prompts: list[list[int]]) -> tuple[dict, dict]:
    """(section, verdicts): on a fresh engine, warmed up and started, the TTFT in ms of `prompts[0]` (the first
    request) and of each later one (misses of the same length: `same_length_prompts`), and the verdict
    `first_request_ttft_over_later_miss` (target <= TARGET). Needs at least two prompts."""
    from local_engine.engine.engine import Engine
    from local_engine.engine.warm_up import warm_up
    from prefixscope.progress import progress

    requests = same_length_prompts(prompts)
    engine = Engine(config, loaded)
    with progress("bench engine: warm-up, then the first request"):
        report = warm_up(engine)
        engine.start()
        try:
            ttfts = asyncio.run(_ttfts(engine, requests))
        finally:
            engine.stop()
    first, later = ttfts[0], statistics.median(ttfts[1:])
    ratio = round(first / later, 3)
    section = {
        "prompt_tokens": len(requests[0]),
        "warm_up_s": round(report.seconds, 2),
        "first_request_ttft_ms": round(first, 1),
        "later_miss_ttft_ms": [round(ttft, 1) for ttft in ttfts[1:]],
        "later_miss_ttft_p50_ms": round(later, 1),
        "first_over_later_miss": ratio,
    }
    verdicts = {"first_request_ttft_over_later_miss": {"value": ratio, "target": f"<= {TARGET}",
                                                       "pass": ratio <= TARGET}}
    return section, verdicts
