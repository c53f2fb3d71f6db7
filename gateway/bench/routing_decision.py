"""The router's decision time over the KV-events index, in process: three replicas whose indexes hold
`indexed_blocks` blocks between them (chains of 16-token blocks from announced `BlockStored` events, a third of them
demoted to host memory), and requests whose prompts share a chain's first blocks then diverge. A decision is
`ReplicaSet.decide` on an already tokenized prompt: the prompt's block keys, a lookup in every replica's index, the
text chain of the approximate index and the policy. Tokenizing is timed apart (it depends on the prompt's length and
runs off the event loop for long prompts).

Each decision is timed twice: on the wall clock and on the thread's CPU clock. On a shared machine the wall clock
also counts the time the process waited for a core; the target is checked against the CPU time, the router's own
cost, and both are printed."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

from gateway.config import UpstreamConfig
from gateway.parsing import CHAT
from gateway.replicas.kv_event_wire import Stored
from gateway.replicas.replica_set import ReplicaSet

BLOCK_SIZE = 16
TARGET_DECISION_P99_MS = 1.0


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def measure_decisions(indexed_blocks: int = 100_000, prompt_tokens: int = 2048, num_requests: int = 2000,
                      seed: int = 0) -> dict:
    """Decision latency percentiles (ms) over `num_requests` requests, with `indexed_blocks` blocks indexed."""
    rng = random.Random(seed)
    urls = tuple(f"http://10.0.0.{i}:8000" for i in range(1, 4))
    replica_set = ReplicaSet(UpstreamConfig(name="bench", url=urls[0], replicas=urls, routing="cache_aware"))
    blocks_per_chain = prompt_tokens // BLOCK_SIZE
    chains: list[list[int]] = []
    next_hash = 0
    while sum(r.index.num_blocks() for r in replica_set.replicas) < indexed_blocks:
        tokens = [rng.randrange(50_000) for _ in range(blocks_per_chain * BLOCK_SIZE)]
        chains.append(tokens)
        replica = replica_set.replicas[len(chains) % 3]
        hashes = tuple(range(next_hash, next_hash + blocks_per_chain))
        next_hash += blocks_per_chain
        tier = 1 if len(chains) % 3 == 0 else 0
        replica.index.apply([Stored(hashes, None, tokens, BLOCK_SIZE, tier, "tenant")])
    for replica in replica_set.replicas:
        replica.subscriber = SimpleNamespace(synced=True)  # followed and current, as a live subscriber would be
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 4 * prompt_tokens}]}
    timings, cpu_timings = [], []
    for _ in range(num_requests):
        shared = rng.randrange(blocks_per_chain) * BLOCK_SIZE
        prompt = rng.choice(chains)[:shared] + [rng.randrange(50_000) for _ in range(prompt_tokens - shared)]
        start, cpu_start = time.perf_counter(), time.thread_time()
        placement = replica_set.decide(CHAT, body, "tenant", "m", prompt)
        cpu_timings.append((time.thread_time() - cpu_start) * 1000.0)
        timings.append((time.perf_counter() - start) * 1000.0)
        replica_set.release(placement, None)
    return {
        "indexed_blocks": sum(r.index.num_blocks() for r in replica_set.replicas),
        "prompt_tokens": prompt_tokens,
        "decisions": num_requests,
        "decision_p50_ms": round(_percentile(timings, 0.5), 4),
        "decision_p99_ms": round(_percentile(timings, 0.99), 4),
        "decision_cpu_p50_ms": round(_percentile(cpu_timings, 0.5), 4),
        "decision_cpu_p99_ms": round(_percentile(cpu_timings, 0.99), 4),
    }


def measure_tokenization(tokenizer, prompt: str, repeats: int = 200) -> dict:
    """Percentiles (ms) of tokenizing one chat request with the gateway's `RequestTokenizer`."""
    body = {"messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "question"}]}
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = tokenizer.prompt_token_ids(CHAT, body)
        timings.append((time.perf_counter() - start) * 1000.0)
    return {"prompt_tokens": len(tokens or ()), "tokenize_p50_ms": round(_percentile(timings, 0.5), 3),
            "tokenize_p99_ms": round(_percentile(timings, 0.99), 3)}
