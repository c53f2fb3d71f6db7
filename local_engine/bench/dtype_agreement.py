"""Greedy agreement of bf16 weights and KV with fp32 on a reference set, for `prefixscope bench engine`.

The reference set is a few chat prompts (short questions, one behind a ~300-token system prompt), answered greedily
(temperature 0, `ignore_eos`) by the same model loaded once in float32 and once in bfloat16, each on its own engine.
Greedy decoding follows the first differing token down another path, so two figures are given: the share of answer
tokens before each answer's first difference (free-running), and the share of answer positions where bf16's greedy
choice equals fp32's token given fp32's answer so far (teacher-forced: both read the same context, one prefill of
prompt + answer per prompt). bf16 passes when the teacher-forced share is at least `1 - BF16_GREEDY_TOLERANCE`
(local_engine.model.loader).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences what a prefix cache is.",
    "List three prime numbers greater than 50.",
    "How do I reverse a list in Python?",
    "Summarise the rules above in one line.",
    "Translate 'good morning' into Spanish and German.",
    "What is 17 times 23?",
)


def reference_prompts(tokenizer, count: int, system: str) -> list[list[int]]:
    """`count` chat prompts (token ids) of the reference set; every third one has `system` as its system prompt."""
    from local_engine.prompt.chat_prompt import chat_prompt_token_ids

    prompts = []
    for index in range(count):
        messages = [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}]
        if index % 3 == 2:
            messages.insert(0, {"role": "system", "content": system})
        prompts.append(chat_prompt_token_ids(tokenizer, messages, None))
    return prompts


async def _greedy(engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from local_engine.engine.sampling import SamplingParams
    from local_engine.engine.types import GenerationRequest, TokenDelta

    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    async def one(token_ids: list[int]) -> list[int]:
        handle = await engine.submit(GenerationRequest(tuple(token_ids), sampling, namespace="dtype-agreement"))
        out: list[int] = []
        async for event in handle.stream():
            if isinstance(event, TokenDelta):
                out.extend(event.token_ids)
        return out

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def greedy_answers(config, loaded, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt's greedy answer (token ids) from a fresh engine on `loaded`."""
    from local_engine.engine.engine import Engine

    engine = Engine(replace(config, kv_cache_tokens=16384, kv_cache_gib=None), loaded)
    engine.start()
    try:
        return asyncio.run(_greedy(engine, prompts, max_tokens))
    finally:
        engine.stop()


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    """How far `other`'s answers follow `reference`'s: identical answers, and the share of reference tokens before
    each answer's first difference."""
    before_difference = 0
    for ref, out in zip(reference, other, strict=True):
        same = 0
        for a, b in zip(ref, out):
            if a != b:
                break
            same += 1
        before_difference += same
    total = sum(len(ref) for ref in reference)
    return {
        "answers": len(reference),
        "identical_answers": sum(ref == out for ref, out in zip(reference, other)),
        "tokens": total,
        "share_before_first_difference": round(before_difference / total, 4) if total else 1.0,
    }


def teacher_forced_share(loaded, prompts: list[list[int]], answers: list[list[int]]) -> float:
    """The share of answer positions where `loaded`'s greedy choice, given the prompt and `answers[i]` so far, is the
    next token of `answers[i]`."""
    import torch

    from local_engine.cache import KVPool
    from local_engine.model.runner import ModelRunner, ScheduledChunk

    longest = max(len(p) + len(a) for p, a in zip(prompts, answers))
    runner = ModelRunner(loaded.model, KVPool(ModelRunner.pool_config_for(loaded.model, loaded.device, loaded.dtype),
                                              longest))
    same = total = 0
    for prompt, answer in zip(prompts, answers, strict=True):
        tokens = list(prompt) + list(answer[:-1])
        step = runner.run([ScheduledChunk(tokens, torch.arange(len(tokens)), True, all_logits=True)])
        chosen = step.chunk_logits[0][len(prompt) - 1 :].argmax(dim=-1).tolist()
        same += sum(a == b for a, b in zip(chosen, answer))
        total += len(answer)
    return same / total if total else 1.0


def run_dtype_agreement(config, loaded, count: int, max_tokens: int, system: str) -> tuple[dict, dict]:
    """The agreement section (bf16 against fp32 on the reference set) and its verdict, which applies only when the
    engine serves bf16 on the CPU (on CUDA bf16 is the default whatever the agreement)."""
    import torch

    from local_engine.model.loader import BF16_GREEDY_TOLERANCE, load_model

    prompts = reference_prompts(loaded.tokenizer, count, system)
    by_dtype = {loaded.dtype: loaded}
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        if dtype not in by_dtype:
            by_dtype[dtype] = load_model(config.model, loaded.device, name)
    answers = {dtype: greedy_answers(config, model, prompts, max_tokens) for dtype, model in by_dtype.items()}
    section = agreement(answers[torch.float32], answers[torch.bfloat16])
    forced = round(teacher_forced_share(by_dtype[torch.bfloat16], prompts, answers[torch.float32]), 4)
    section.update({"max_tokens": max_tokens, "teacher_forced_share": forced, "tolerance": BF16_GREEDY_TOLERANCE,
                    "within_tolerance": forced >= 1 - BF16_GREEDY_TOLERANCE})
    verdicts = {}
    if loaded.dtype == torch.bfloat16 and loaded.device.type == "cpu":
        verdicts["bf16_greedy_agreement_with_fp32"] = {
            "value": forced, "target": f">= {1 - BF16_GREEDY_TOLERANCE}", "pass": section["within_tolerance"]}
    return section, verdicts
