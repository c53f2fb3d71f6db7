"""`prefixscope bench tiers`: time to first token when a long prefix comes back from each cache tier, against the
cold miss, on one model load.

The prefix is a ~2k-token system prompt (`--prefix-tokens`); every request is it (or a fresh one, for misses) plus a
short distinct question, with one output token, since only the time to the first one is measured:

- **L2 (host)**: an engine with a device pool of about 1.5 requests and a host pool of many: one other prefix
  pushes ours out of the device pool into the host pool, then ours is asked again and loaded back (its admission
  also evicts the other prefix from the device: under `write_back` that needs a copy down, which the engine's idle
  write-back cleaner has begun, in pieces, before this request arrived; the rest is paid by this request);
- **L1 (device)**: right after, the prefix once more, now in the device pool of the same engine: L1 and L2 hits
  alternate on one engine, so a change in machine load touches both sides of their ratio alike;
- **L3 (disk)**: an engine with a `--disk-cache-dir` (a temporary directory) serves the prefix once and stops; each
  repeat then starts a new engine on the same directory (a restart) and asks for the prefix;
- **miss**: right after each L3 hit, on the same engine, a system prompt never seen before.

TTFT is measured inside the engine (submit to first token: queue, load-back and prefill). Prints one JSON object:
TTFT p50/p95 per tier with its parts (admission: queue, room and load-back; bookkeeping; prefill), load ms per
tier, the restart hit share (the smallest share, over the restarts, of the prefix's tokens served from disk) and a
verdict per target: L2 hit TTFT p50 <= 1.5x L1's; L3 hit TTFT p50 <= 0.25x the miss's; after a restart >= 95% of
the prefix's tokens come from disk. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass

from local_engine.options import at_least

NAMESPACE = "bench-tiers"
TARGET_L2_OVER_L1 = 1.5
TARGET_L3_OVER_MISS = 0.25
TARGET_RESTART_SHARE = 0.95


@dataclass(frozen=True)
class Sample:
    """One measured request: where its matched tokens came from and how long it took (ms)."""

    ttft_ms: float
    load_ms: float
    admission_ms: float  # submit to admission: queue, making room in the device pool, loading back
    bookkeeping_ms: float  # tree and slot work, the copies down of what was evicted to make room included
    prefill_ms: float
    prompt_tokens: int
    device_tokens: int
    host_tokens: int
    disk_tokens: int


def engine_config(model: str, device: str, *options: str):
    """An `EngineConfig` built from `prefixscope engine` options, so the bench runs exactly what the flags give."""
    from local_engine.config import EngineConfig
    from local_engine.options import add_options, config_from

    parser = argparse.ArgumentParser()
    add_options(parser, EngineConfig, passed_on=True)
    return config_from(EngineConfig, parser.parse_args(["--model", model, "--device", device, *options]))


def _question(index: int) -> str:
    return f"Customer {index} asks: can order {7000 + 11 * index} be delivered by day {index % 28 + 1}?"


def request_ids(tokenizer, system: str, index: int) -> tuple[int, ...]:
    from local_engine.prompt.chat_prompt import chat_prompt_token_ids

    messages = [{"role": "system", "content": system}, {"role": "user", "content": _question(index)}]
    return tuple(chat_prompt_token_ids(tokenizer, messages, None))


def shared_prefix_tokens(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common leading token run of two requests: the prefix a cache can serve to both."""
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


async def _one(engine, token_ids: tuple[int, ...], namespace: str) -> Sample:
    from local_engine.engine.types import Finished, GenerationRequest
    from local_engine.engine.sampling import SamplingParams

    sampling = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    handle = await engine.submit(GenerationRequest(token_ids, sampling, namespace=namespace))
    report = handle.report.result()
    finished = None
    async for event in handle.stream():
        if isinstance(event, Finished):
            finished = event
    tiers, timings = report.tiers, finished.timings
    return Sample(timings.ttft_ms, report.load_ms, timings.queued_ms, timings.bookkeeping_ms, timings.prefill_ms,
                  report.prompt_tokens, tiers.device, tiers.host, tiers.disk)


def send(engine, token_ids: tuple[int, ...], namespace: str = NAMESPACE) -> Sample:
    return asyncio.run(_one(engine, token_ids, namespace))


@contextmanager
def running(config, loaded):
    """A started engine, warmed up with a short prompt outside the bench's namespace; stopped on exit."""
    from local_engine.engine.engine import Engine

    engine = Engine(config, loaded)
    engine.start()
    try:
        send(engine, tuple(loaded.tokenizer.encode("Warm-up: say hello.")), namespace="warm-up")
        yield engine
    finally:
        engine.stop()


def _p(values: list[float], q: float) -> float | None:
    from local_engine.bench.engine import percentile

    value = percentile(values, q)
    return None if value is None else round(value, 2)


def summary(samples: list[Sample]) -> dict:
    ttft = [s.ttft_ms for s in samples]
    return {
        "n": len(samples),
        "ttft_p50_ms": _p(ttft, 0.5),
        "ttft_p95_ms": _p(ttft, 0.95),
        "load_ms_p50": _p([s.load_ms for s in samples], 0.5),
        "admission_ms_p50": _p([s.admission_ms for s in samples], 0.5),
        "bookkeeping_ms_p50": _p([s.bookkeeping_ms for s in samples], 0.5),
        "prefill_ms_p50": _p([s.prefill_ms for s in samples], 0.5),
        "prompt_tokens_mean": _mean([s.prompt_tokens for s in samples]),
        "tier_tokens_mean": {"device": _mean([s.device_tokens for s in samples]),
                             "host": _mean([s.host_tokens for s in samples]),
                             "disk": _mean([s.disk_tokens for s in samples])},
    }


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def verdicts(ttft_p50: dict, restart_share: float) -> dict:
    """The three targets, each with its value, the target and pass/fail."""
    l2_over_l1 = round(ttft_p50["host"] / ttft_p50["device"], 3)
    l3_over_miss = round(ttft_p50["disk"] / ttft_p50["miss"], 3)
    return {
        "l2_hit_ttft_over_l1_hit_ttft_p50": {"value": l2_over_l1, "target": f"<= {TARGET_L2_OVER_L1}",
                                            "pass": l2_over_l1 <= TARGET_L2_OVER_L1},
        "l3_hit_ttft_over_miss_ttft_p50": {"value": l3_over_miss, "target": f"<= {TARGET_L3_OVER_MISS}",
                                          "pass": l3_over_miss <= TARGET_L3_OVER_MISS},
        "restart_disk_share_of_prefix_tokens": {"value": round(restart_share, 4),
                                                "target": f">= {TARGET_RESTART_SHARE}",
                                                "pass": restart_share >= TARGET_RESTART_SHARE},
    }


def run_tiers_benchmark(args: argparse.Namespace) -> int:
    from local_engine.bench.engine import system_prompt
    from local_engine.engine.compute_threads import serialize_caller
    from local_engine.model.loader import load_model, resolve_device

    from prefixscope.progress import progress

    serialize_caller()  # torch's threads are the engine worker's, as in `prefixscope engine`
    with progress(f"bench tiers: loading {args.model}"):
        loaded = load_model(args.model, resolve_device(args.device))
    tokenizer, repeats = loaded.tokenizer, args.repeats
    prefix = system_prompt(tokenizer, 0, args.prefix_tokens, args.seed)
    # hits[0] stores the prefix; then two questions per repeat for L2 and L1, and one for L3.
    hits = [request_ids(tokenizer, prefix, i) for i in range(1 + 3 * repeats)]
    misses = [request_ids(tokenizer, system_prompt(tokenizer, 100 + r, args.prefix_tokens, args.seed), r)
              for r in range(repeats)]
    others = [request_ids(tokenizer, system_prompt(tokenizer, 200 + r, args.prefix_tokens, args.seed), r)
              for r in range(repeats)]
    prefix_tokens = shared_prefix_tokens(hits[0], hits[1])
    request_tokens = max(len(ids) for ids in hits + misses + others) + 1  # + the one output token
    # Device pool sizes: room for a few requests (nothing of ours is evicted), or for 1.5 requests, so that
    # serving one other prefix must push ours out to the host pool.
    roomy, tight = str(4 * request_tokens), str(request_tokens * 3 // 2)
    device, model, policy = args.device, args.model, ("--cache-write-policy", args.write_policy)
    samples: dict[str, list[Sample]] = {"miss": [], "device": [], "host": [], "disk": []}
    with progress("bench tiers: L2 (host) and L1", total=2 + 5 * repeats, unit="requests") as bar:
        l2_options = ("--kv-cache-tokens", tight, "--host-cache-tokens", roomy, *policy)
        with running(engine_config(model, device, *l2_options), loaded) as engine:
            send(engine, hits[0])
            bar.advance()
            for r in range(repeats):
                send(engine, others[r])  # pushes the prefix out of the device pool
                samples["host"].append(send(engine, hits[1 + 2 * r]))
                samples["device"].append(send(engine, hits[2 + 2 * r]))
                bar.advance(3)
        bar.describe("bench tiers: L3 (disk, after restarts) and misses")
        with tempfile.TemporaryDirectory(prefix="prefixscope-bench-tiers-") as disk_dir:
            l3_options = ("--kv-cache-tokens", roomy, "--disk-cache-dir", disk_dir, "--disk-cache-gib", "2", *policy)
            with running(engine_config(model, device, *l3_options), loaded) as engine:
                send(engine, hits[0])
                bar.advance()
            for r in range(repeats):
                with running(engine_config(model, device, *l3_options), loaded) as engine:  # a restart
                    samples["disk"].append(send(engine, hits[1 + 2 * repeats + r]))
                    samples["miss"].append(send(engine, misses[r]))
                bar.advance(2)
    restart_share = min(s.disk_tokens for s in samples["disk"]) / prefix_tokens
    sections = {name: summary(values) for name, values in samples.items()}
    ttft_p50 = {name: section["ttft_p50_ms"] for name, section in sections.items()}
    checks = verdicts(ttft_p50, restart_share)
    report = {
        "model": loaded.model_id,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "workload": {"prefix_tokens": prefix_tokens, "request_tokens_max": request_tokens, "repeats": repeats,
                     "device_pool_tokens": {"roomy": int(roomy), "tight": int(tight)},
                     "host_pool_tokens": int(roomy), "cache_write_policy": args.write_policy},
        "ttft_p50_ms": ttft_p50,
        "load_ms_p50": {name: sections[name]["load_ms_p50"] for name in ("device", "host", "disk")},
        "restart_disk_share_min": round(restart_share, 4),
        "by_tier": sections,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "verdicts": checks,
        "pass": all(v["pass"] for v in checks.values()),
    }
    from prefixscope.bench_report import emit

    return emit(report)


def register(commands, bench_commands) -> None:
    bench = bench_commands.add_parser(
        "tiers", help="TTFT of a long prefix served from the device, host and disk tiers, against the cold miss")
    bench.add_argument("--model", default="smollm2", help="'smollm2' or a local transformers model directory")
    bench.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where the engine runs")
    bench.add_argument("--prefix-tokens", type=at_least(64), default=2048, help="tokens of the shared system prompt")
    bench.add_argument("--repeats", type=at_least(1), default=5, help="measured requests per tier")
    bench.add_argument("--write-policy", default="write_back", choices=["write_back", "write_through"],
                       help="--cache-write-policy of the host- and disk-tier engines (write_back: the L2 hit's "
                            "admission pays for demoting what it evicts; a clean stop writes the cache to disk either way)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the prompts' random text")
    bench.set_defaults(handler=run_tiers_benchmark)
