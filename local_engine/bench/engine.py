"""`prefixscope bench engine`: time-to-first-token on repeated long system prompts, with and without the cache,
then throughput and latency with many requests in flight (bench_concurrent), each run's inter-token latency beside
the memory-bandwidth floor of a decode step (decode_floor), and bf16's greedy agreement with fp32 (dtype_agreement).

The workload is what agents and support bots send: a few distinct ~2k-token system prompts, each followed by short
user turns, interleaved. The first request of each prompt is a miss; the rest can reuse its KV. The same workload
then runs on NoPrefixCache as the baseline. Prints one JSON object with a pass/fail verdict per target; progress
goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
from dataclasses import replace

_WORDS = (
    "account agent answer billing cache policy refund customer escalate order shipment invoice tool schema "
    "document retrieval context summary priority ticket warranty subscription renewal discount region compliance "
    "privacy security audit latency throughput token budget response format citation section clause appendix"
).split()


def system_prompt(tokenizer, index: int, num_tokens: int, seed: int) -> str:
    """A distinct policy-manual-like system prompt of about `num_tokens` tokens."""
    rng = random.Random(seed * 1000 + index)
    lines = [f"You are support assistant #{index}. Follow the manual below exactly."]
    while len(tokenizer.encode("\n".join(lines), add_special_tokens=False)) < num_tokens:
        words = " ".join(rng.choice(_WORDS) for _ in range(24))
        lines.append(f"Rule {index}.{len(lines)}: {words}.")
    text = "\n".join(lines)
    token_ids = tokenizer.encode(text, add_special_tokens=False)[:num_tokens]
    return tokenizer.decode(token_ids)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = int(position), min(int(position) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _summary(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50_ms": _round(percentile(values, 0.5)),
        "p95_ms": _round(percentile(values, 0.95)),
    }


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


async def _run_workload(engine, workload, max_tokens: int, bar=None):
    from local_engine.engine.counters import EngineCounters
    from local_engine.engine.types import Finished, GenerationRequest
    from local_engine.engine.sampling import SamplingParams
    from local_engine.model import cpu_kernels

    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    warmup = GenerationRequest(tuple(workload[0][1][:64]), sampling, namespace="warm-up")
    handle = await engine.submit(warmup)
    async for _ in handle.stream():
        pass
    engine.counters = EngineCounters()  # measure the workload alone, not the warm-up
    paths = cpu_kernels.path_counts()  # which kernel paths the workload's steps ran, from here
    results = []
    for is_first_seen, token_ids in workload:
        handle = await engine.submit(GenerationRequest(tuple(token_ids), sampling, namespace="bench"))
        report = handle.report.result()
        async for event in handle.stream():
            if isinstance(event, Finished):
                results.append((is_first_seen, report, event))
        if bar is not None:
            bar.advance()
    return results, cpu_kernels.paths_since(paths)


def _measure(engine, workload, max_tokens: int, label: str) -> dict:
    from prefixscope.progress import progress

    engine.start()
    try:
        with progress(f"bench engine: {label}", total=len(workload), unit="requests") as bar:
            results, paths = asyncio.run(_run_workload(engine, workload, max_tokens, bar))
    finally:
        engine.stop()
    miss_ttft = [f.timings.ttft_ms for first, _, f in results if first]
    hit_ttft = [f.timings.ttft_ms for first, _, f in results if not first]
    decode_steps = sum(f.timings.num_decode_steps for _, _, f in results)
    decode_ms = sum(f.timings.decode_ms for _, _, f in results)
    counters = engine.counters
    return {
        "cpu_kernel_paths": paths,  # the paths the measured steps ran (local_engine.model.cpu_kernels.path_counts)
        "ttft_first_seen": _summary(miss_ttft),
        "ttft_repeated": _summary(hit_ttft),
        "cached_tokens_repeated_mean": _round(statistics.mean(r.matched_tokens for first, r, _ in results if not first)),
        "prompt_tokens_mean": _round(statistics.mean(r.prompt_tokens for _, r, _ in results)),
        "decode_tokens_per_s": _round(decode_steps / (decode_ms / 1000)) if decode_ms else None,
        "prefill_tokens_per_s": _round(counters.prefill_tokens / counters.prefill_s) if counters.prefill_s else None,
        "bookkeeping_share_of_engine_time": round(counters.bookkeeping_s / counters.engine_busy_s, 5),
        "bookkeeping_ms_per_request": _round(counters.bookkeeping_s * 1000 / len(results), 3),
    }


def _api_sections(args: argparse.Namespace, config, loaded, long_prompt: list[int]) -> tuple[dict | None, dict]:
    """Constrained decoding's cost and n=4's saving (`local_engine.bench.apis`), on a fresh engine."""
    from local_engine.bench.apis import run_apis_workload
    from local_engine.engine.engine import Engine
    from local_engine.prompt.chat_prompt import chat_prompt_token_ids

    if not args.api_rounds:
        return None, {}
    messages = [{"role": "user", "content": "List the order numbers of last week as JSON."}]
    short_prompt = tuple(chat_prompt_token_ids(loaded.tokenizer, messages, None))
    engine = Engine(config, loaded)
    engine.start()
    try:
        return run_apis_workload(engine, short_prompt, tuple(long_prompt), rounds=args.api_rounds)
    finally:
        engine.stop()


def _paths_total(*sections: dict) -> dict[str, int]:
    """The `cpu_kernel_paths` of measured sections, added up."""
    total: dict[str, int] = {}
    for section in sections:
        for path, count in section["cpu_kernel_paths"].items():
            total[path] = total.get(path, 0) + count
    return total


def run_engine_benchmark(args: argparse.Namespace) -> int:
    from local_engine.bench.concurrent import concurrency_verdicts, run_concurrent_workload
    from local_engine.bench.decode_floor import floor_section, floor_verdicts, read_bandwidth_gb_s
    from local_engine.bench.dtype_agreement import run_dtype_agreement
    from local_engine.prompt.chat_prompt import chat_prompt_token_ids
    from local_engine.config import EngineConfig
    from local_engine.engine.compute_threads import on_worker_threads, serialize_caller
    from local_engine.engine.engine import Engine
    from local_engine.model import cpu_kernels
    from local_engine.model.loader import load_model, resolve_device
    from local_engine.options import config_from
    from prefixscope.progress import progress

    config = config_from(EngineConfig, args)
    serialize_caller()  # torch's threads are the engine worker's, as in `prefixscope engine`
    with progress(f"bench engine: loading {config.model}"):
        loaded = load_model(config.model, resolve_device(config.device), config.dtype)
    tokenizer = loaded.tokenizer
    prompts = [system_prompt(tokenizer, i, args.prefix_tokens, args.seed) for i in range(args.num_prefixes)]
    # Prompt i first appears in round i and then recurs every round: misses and hits interleave in time, so a
    # change in machine load affects both sides of the ratio alike.
    workload = []
    for round_index in range(args.num_prefixes + args.turns_per_prefix - 1):
        for index, prompt in enumerate(prompts):
            turn = round_index - index
            if not 0 <= turn < args.turns_per_prefix:
                continue
            question = f"Customer {turn}-{index} asks: how do I get a refund for order {1000 + 7 * turn + index}?"
            messages = [{"role": "system", "content": prompt}, {"role": "user", "content": question}]
            workload.append((turn == 0, chat_prompt_token_ids(tokenizer, messages, None)))

    # First, before any other section runs the model in this process: the first request after ready.
    from local_engine.bench.first_request import LATER_MISSES, run_first_request

    first_prompts = [chat_prompt_token_ids(tokenizer, [{"role": "system", "content": system_prompt(
        tokenizer, 100 + i, args.prefix_tokens, args.seed)}, {"role": "user", "content": "Hello."}], None)
        for i in range(1 + LATER_MISSES)]
    first_request, first_request_verdicts = run_first_request(config, loaded, first_prompts)
    cached = _measure(Engine(config, loaded), workload, args.max_tokens, "prefix cache")
    baseline = _measure(Engine(replace(config, prefix_cache=False), loaded), workload, args.max_tokens, "no cache")
    hit_p50, miss_p50 = cached["ttft_repeated"]["p50_ms"], cached["ttft_first_seen"]["p50_ms"]
    concurrent = floor = None
    if args.concurrency:
        engine = Engine(config, loaded)
        engine.start()
        try:
            paths = cpu_kernels.path_counts()
            concurrent = run_concurrent_workload(engine, tokenizer, args)
            concurrent["cpu_kernel_paths"] = cpu_kernels.paths_since(paths)
        finally:
            engine.stop()
        bandwidth = on_worker_threads(lambda: read_bandwidth_gb_s(loaded.device))  # the threads the engine ran on
        floor = floor_section(engine, concurrent["runs"], args.num_prefixes, bandwidth)
    apis, api_verdicts = _api_sections(args, config, loaded, workload[0][1])
    invariance = invariance_cost = None
    invariance_verdicts: dict = {}
    if args.invariance_prompts:
        from local_engine.bench.invariance import run_invariance_check, run_invariance_cost

        invariance, invariance_verdicts = run_invariance_check(config, loaded, args.invariance_prompts, args.seed)
        invariance_cost = run_invariance_cost(config, loaded, args.num_prefixes, args.seed)
    agreement, agreement_verdicts = None, {}
    if args.agreement_prompts:
        agreement, agreement_verdicts = run_dtype_agreement(config, loaded, args.agreement_prompts, 32,
                                                            system_prompt(tokenizer, 7, 300, args.seed))
    hit_over_miss = round(hit_p50 / miss_p50, 4)
    bookkeeping = cached["bookkeeping_share_of_engine_time"]
    verdicts = {
        "hit_ttft_over_miss_ttft_p50": {"value": hit_over_miss, "target": "<= 0.05", "pass": hit_over_miss <= 0.05},
        "bookkeeping_share_of_engine_time": {"value": bookkeeping, "target": "<= 0.01", "pass": bookkeeping <= 0.01},
    }
    if concurrent:
        verdicts.update(concurrency_verdicts(concurrent))
        verdicts.update(floor_verdicts(floor))
    verdicts.update(api_verdicts)
    verdicts.update(first_request_verdicts)
    verdicts.update(agreement_verdicts)
    verdicts.update(invariance_verdicts)
    report = {
        "model": loaded.model_id,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        # the paths that ran in the measured steps, with and without the cache: counts of the CPU kernels' calls
        # (amx_chunk_attention, matmul_512, matmul_256, decode_layers) and of steps on torch's kernels (torch)
        "cpu_kernels": _paths_total(cached, baseline),
        "workload": {
            "num_prefixes": args.num_prefixes,
            "prefix_tokens": args.prefix_tokens,
            "turns_per_prefix": args.turns_per_prefix,
            "requests": len(workload),
            "max_tokens": args.max_tokens,
            "page_size": config.page_size,
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
        },
        "first_request_after_ready": first_request,
        "prefix_cache": cached,
        "no_prefix_cache": baseline,
        "hit_ttft_over_miss_ttft_p50": hit_over_miss,
        "repeated_ttft_speedup_vs_no_cache_p50": round(baseline["ttft_repeated"]["p50_ms"] / hit_p50, 2),
        "concurrent_shared_prefix": concurrent,
        "decode_floor": floor,
        "bf16_agreement_with_fp32": agreement,
        "batch_invariance": invariance,
        # output tokens/s with and without batch invariance, and its cost as a share of the fast path's
        "batch_invariance_cost": invariance_cost,
        "apis": apis,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "verdicts": verdicts,
        "pass": all(v["pass"] for v in verdicts.values()),
    }
    from prefixscope.bench_report import emit

    return emit(report)
