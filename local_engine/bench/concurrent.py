"""The concurrent shared-prefix workload of `prefixscope bench engine`: throughput and latency under load.

K system prompts of 1.5-2k tokens; each request is one of them plus a short distinct question, streamed, with C
requests in flight at a time (closed loop) for C in `--concurrency`, and for each `--bench-max-tokens`. The
prompts are computed once before the runs, so the runs measure serving shared prefixes from cache, as agents and
support bots do. Reports per run: requests/s, output tokens/s, TTFT and inter-token latency percentiles (measured by the
client, from submit), the worker's decode steps phase by phase, the cached share of prompt tokens, and the memory growth
during the run next to the KV pool's bytes (a per-request copy of the KV would show up as growth beyond the pool). The
growth is measured where the pool lives: on CUDA, the device's allocated bytes (`torch.cuda.max_memory_allocated`, reset
at the run's start); on the CPU, the process's resident set size. The host RSS is reported in both cases.
Progress goes to stderr through `prefixscope.progress`, like every other benchmark's.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import replace

from local_engine.bench.engine import percentile, system_prompt
from prefixscope.progress import Progress, progress


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRss:
    """Samples the resident set size every 20 ms while running."""

    def __init__(self) -> None:
        self.start_bytes = _rss_bytes()
        self.peak_bytes = self.start_bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak_bytes = max(self.peak_bytes, _rss_bytes())

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, _rss_bytes())


class _PeakDeviceMemory:
    """The peak of `torch.cuda.memory_allocated(device)` over the run, and its value at the start (CUDA only)."""

    def __init__(self, device) -> None:
        import torch

        self._cuda = torch.cuda
        self._device = device
        self._cuda.synchronize(device)
        self._cuda.reset_peak_memory_stats(device)
        self.start_bytes = self._cuda.memory_allocated(device)
        self.peak_bytes = self.start_bytes

    def __enter__(self) -> _PeakDeviceMemory:
        return self

    def __exit__(self, *exc) -> None:
        self._cuda.synchronize(self._device)
        self.peak_bytes = max(self.start_bytes, self._cuda.max_memory_allocated(self._device))


def kv_memory_probe(device):
    """What shows a second copy of the KV: device memory where the pool is on CUDA, else the host's RSS.
    Returns `(name, probe)`: `cuda_allocated` or `host_rss`, and a context manager with `start_bytes`/`peak_bytes`."""
    if getattr(device, "type", str(device)) == "cuda":
        return "cuda_allocated", _PeakDeviceMemory(device)
    return "host_rss", _PeakRss()


def build_prompts(tokenizer, num_prefixes: int, seed: int) -> list[str]:
    """K system prompts spread over 1536..2048 tokens."""
    step = 512 // max(1, num_prefixes - 1)
    return [system_prompt(tokenizer, 100 + i, 1536 + min(512, i * step), seed) for i in range(num_prefixes)]


def request_token_ids(tokenizer, prompts: list[str], index: int) -> list[int]:
    from local_engine.prompt.chat_prompt import chat_prompt_token_ids

    question = f"Customer {index} asks: where is order {4000 + 13 * index} and can it ship by day {index % 28 + 1}?"
    messages = [{"role": "system", "content": prompts[index % len(prompts)]}, {"role": "user", "content": question}]
    return chat_prompt_token_ids(tokenizer, messages, None)


async def _one(engine, token_ids: list[int], max_tokens: int) -> dict:
    from local_engine.engine.types import Finished, GenerationRequest, TokenDelta
    from local_engine.engine.sampling import SamplingParams

    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    handle = await engine.submit(GenerationRequest(tuple(token_ids), sampling, namespace="bench-concurrent"))
    token_times, finished = [], None
    async for event in handle.stream():
        if isinstance(event, TokenDelta):
            token_times.append(time.perf_counter())
        elif isinstance(event, Finished):
            finished = event
    return {"started": started, "token_times": token_times, "finished": finished}


async def _run(engine, requests: list[list[int]], concurrency: int, max_tokens: int, bar: Progress) -> list[dict]:
    gate = asyncio.Semaphore(concurrency)

    async def limited(token_ids):
        async with gate:
            result = await _one(engine, token_ids, max_tokens)
        bar.advance()
        return result

    return await asyncio.gather(*(limited(r) for r in requests))


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def measure_concurrency(engine, tokenizer, prompts, concurrency: int, max_tokens: int, num_requests: int,
                        offset: int) -> dict:
    requests = [request_token_ids(tokenizer, prompts, offset + i) for i in range(num_requests)]
    label = f"bench engine: C={concurrency} max_tokens={max_tokens}"
    memory_source, memory = kv_memory_probe(engine.pool.config.device)
    phases_before = replace(engine.counters.decode_steps)
    with _PeakRss() as rss, memory, progress(label, total=num_requests, unit="requests") as bar:
        started = time.perf_counter()
        results = asyncio.run(_run(engine, requests, concurrency, max_tokens, bar))
        elapsed = time.perf_counter() - started
    ttft = [r["token_times"][0] - r["started"] for r in results if r["token_times"]]
    itl = [b - a for r in results for a, b in zip(r["token_times"], r["token_times"][1:])]
    output_tokens = sum(r["finished"].completion_tokens for r in results)
    prompt_tokens = sum(r["finished"].prompt_tokens for r in results)
    cached_tokens = sum(r["finished"].cached_tokens for r in results)
    figures = {
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "requests": num_requests,
        "seconds": round(elapsed, 2),
        "requests_per_s": round(num_requests / elapsed, 3),
        "output_tokens_per_s": round(output_tokens / elapsed, 2),
        "ttft_p50_ms": _ms(percentile(ttft, 0.5)),
        "ttft_p99_ms": _ms(percentile(ttft, 0.99)),
        "itl_p50_ms": _ms(percentile(itl, 0.5)),
        "itl_p99_ms": _ms(percentile(itl, 0.99)),
        # The worker's decode-only steps, phase by phase (local_engine.engine.counters.DecodeStepPhases).
        "decode_step_ms": engine.counters.decode_steps.since(phases_before).per_step_ms(),
        "cached_share_of_prompt_tokens": round(cached_tokens / prompt_tokens, 4) if prompt_tokens else None,
        "prompt_tokens_mean": round(prompt_tokens / num_requests, 1),
        "cached_tokens_mean": round(cached_tokens / num_requests, 1),
        "peak_rss_bytes": rss.peak_bytes,
        "rss_growth_bytes": rss.peak_bytes - rss.start_bytes,
        # Where the pool lives: what a second copy of its KV would grow.
        "kv_memory_source": memory_source,
        "kv_memory_growth_bytes": memory.peak_bytes - memory.start_bytes,
        "kv_pool_bytes": engine.pool.num_bytes,
    }
    return figures


def run_concurrent_workload(engine, tokenizer, args) -> dict:
    """Every (max_tokens, concurrency) run on one started engine; returns the JSON section and its verdicts."""
    prompts = build_prompts(tokenizer, args.num_prefixes, args.seed)
    warm_up = [request_token_ids(tokenizer, prompts, i) for i in range(len(prompts))]
    with progress("bench engine: computing the shared system prompts once", total=len(prompts),
                  unit="prompts") as bar:
        asyncio.run(_run(engine, warm_up, 1, 1, bar))
    runs, offset = [], 1000
    for max_tokens in args.bench_max_tokens:
        for concurrency in args.concurrency:
            num_requests = max(args.requests_per_run, concurrency)
            runs.append(measure_concurrency(engine, tokenizer, prompts, concurrency, max_tokens, num_requests,
                                            offset))
            offset += num_requests
    return {"prefix_tokens": "1536-2048", "num_prefixes": len(prompts), "runs": runs}


def concurrency_verdicts(section: dict) -> dict:
    """Targets: tokens/s at C=8 >= 3x C=1, and C=32 >= C=8 (per max_tokens); at C=32, the growth of the memory the
    pool lives in (device memory on CUDA, host RSS on the CPU) < the pool's bytes."""
    verdicts = {}
    by_key = {(r["max_tokens"], r["concurrency"]): r for r in section["runs"]}
    for (max_tokens, concurrency), run in sorted(by_key.items()):
        if concurrency == 8 and (max_tokens, 1) in by_key:
            ratio = run["output_tokens_per_s"] / by_key[(max_tokens, 1)]["output_tokens_per_s"]
            verdicts[f"tokens_per_s_c8_over_c1_max_tokens_{max_tokens}"] = {
                "value": round(ratio, 2), "target": ">= 3", "pass": ratio >= 3}
        if concurrency == 32 and (max_tokens, 8) in by_key:
            ratio = run["output_tokens_per_s"] / by_key[(max_tokens, 8)]["output_tokens_per_s"]
            verdicts[f"tokens_per_s_c32_over_c8_max_tokens_{max_tokens}"] = {
                "value": round(ratio, 2), "target": ">= 1", "pass": ratio >= 1}
        if concurrency == 32:
            growth = run["kv_memory_growth_bytes"]
            verdicts[f"memory_growth_c32_below_pool_bytes_max_tokens_{max_tokens}"] = {
                "value": growth, "target": f"< {run['kv_pool_bytes']}", "memory": run["kv_memory_source"],
                "pass": growth < run["kv_pool_bytes"]}
    return verdicts
