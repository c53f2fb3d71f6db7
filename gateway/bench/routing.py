"""`prefixscope bench routing`: cache-aware routing against round robin over 2 and 3 engine replicas.

For each replica count: start the engines (each with a KV pool of about `pool_share` of the working set), then for
each policy flush their caches, start a gateway with that policy and replay the same request sequence: `K` system
prompts of about `prompt_tokens` tokens (their total exceeds one pool but fits all of them together), each asked
`rounds` times with a different question, in a seeded random order, one request at a time, streamed. Prints one
JSON object: token hit rate, TTFT p50/p99 (ms, measured by the client) and requests per replica for each policy,
and the verdict against the targets: cache_aware hit rate >= 0.85 and >= 1.5x round_robin's, TTFT p99 no worse.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

import socket

ADMIN_TOKEN = "bench-routing-admin"
TARGET_HIT_RATE = 0.85
TARGET_RATIO = 1.5


@dataclass(frozen=True)
class RoutingBenchConfig:
    model: str = "smollm2"
    replica_counts: tuple[int, ...] = (2, 3)
    num_prompts: int = 4
    prompt_tokens: int = 1500
    rounds: int = 20
    pool_share: float = 0.6  # each pool holds this share of the working set
    seed: int = 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _system_prompt(index: int, num_words: int) -> str:
    rng = random.Random(index)
    words = ["order", "refund", "parcel", "invoice", "warranty", "repair", "account", "shipping", "voucher", "store"]
    body = " ".join(f"{rng.choice(words)}-{rng.randrange(1000)}" for _ in range(num_words))
    return f"Policy book {index}. Follow these rules: {body}"


def _spawn(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as handle:
        return subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not become healthy")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _engine_command(model: str, port: int, pool_tokens: int) -> list[str]:
    return [sys.executable, "-m", "prefixscope", "engine", "--model", model, "--device", "cpu", "--port", str(port),
            "--admin-token", ADMIN_TOKEN, "--log-level", "warning", "--kv-cache-tokens", str(pool_tokens)]


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def _stream_one(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, int, int]:
    """(TTFT ms, prompt tokens, cached tokens) of one streamed request."""
    start = time.perf_counter()
    ttft_ms: float | None = None
    usage: dict[str, Any] = {}
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            # The first token, not the opening chunk that only names the role (sent before the prefill).
            if ttft_ms is None and choices and ((choices[0].get("delta") or {}).get("content")
                                                or choices[0].get("finish_reason")):
                ttft_ms = (time.perf_counter() - start) * 1000.0
            if chunk.get("usage"):
                usage = chunk["usage"]
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return ttft_ms or (time.perf_counter() - start) * 1000.0, int(usage.get("prompt_tokens") or 0), cached


def _replica_requests(metrics_text: str) -> dict[str, int]:
    found = re.findall(r'prefixscope_gateway_replica_requests_total\{replica="([^"]+)",upstream="[^"]+"\} ([0-9.]+)',
                       metrics_text)
    return {url: int(float(value)) for url, value in found}


def _run_policy(
    policy: str, engine_urls: list[str], sequence: list[dict[str, Any]], workdir: Path
) -> dict[str, Any]:
    for url in engine_urls:
        httpx.post(f"{url}/v1/cache/flush", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
    port = free_port()
    gateway_url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "prefixscope", "gateway", "--port", str(port), "--routing", policy,
               "--database-url", f"sqlite:///{workdir / f'{policy}-{len(engine_urls)}.db'}", "--log-level", "warning",
               "--open"]  # a local bench with a fresh database: no keys, and its client sends none
    for url in engine_urls:
        command += ["--upstream", url]
    gateway = _spawn(command, workdir / "gateway.log")
    try:
        _wait_healthy(gateway_url, gateway)
        time.sleep(1.0)  # the first event sync
        ttfts, prompt_total, cached_total = [], 0, 0
        with httpx.Client(timeout=600) as client:
            for body in sequence:
                ttft_ms, prompt_tokens, cached_tokens = _stream_one(client, gateway_url, body)
                ttfts.append(ttft_ms)
                prompt_total += prompt_tokens
                cached_total += cached_tokens
            time.sleep(0.5)  # the last record reaches the counters just after its response
            per_replica = _replica_requests(client.get(f"{gateway_url}/metrics").text)
        return {
            "token_hit_rate": round(cached_total / prompt_total, 4) if prompt_total else 0.0,
            "ttft_p50_ms": round(_percentile(ttfts, 0.5), 1),
            "ttft_p99_ms": round(_percentile(ttfts, 0.99), 1),
            "requests_per_replica": [per_replica.get(url, 0) for url in engine_urls],
            "requests": len(sequence),
        }
    finally:
        _stop(gateway)


def run(config: RoutingBenchConfig) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="prefixscope-bench-routing-"))
    num_words = max(10, config.prompt_tokens // 4)  # "word-123" is about 4 tokens
    systems = [_system_prompt(i, num_words) for i in range(config.num_prompts)]
    results: dict[str, Any] = {"model": config.model, "prompts": config.num_prompts, "rounds": config.rounds}
    passed = True
    for num_replicas in config.replica_counts:
        engines: list[tuple[str, subprocess.Popen[bytes]]] = []
        try:
            # Size the pools from real token counts: one small engine tokenizes the prompts (a dry-run match).
            sizing_port = free_port()
            sizing_url = f"http://127.0.0.1:{sizing_port}"
            engines.append((sizing_url, _spawn(_engine_command(config.model, sizing_port, 1024),
                                               workdir / "engine-sizing.log")))
            _wait_healthy(sizing_url, engines[0][1])
            model = httpx.get(f"{sizing_url}/v1/models", timeout=10).json()["data"][0]["id"]
            working_set = 0
            for system in systems:
                messages = [{"role": "system", "content": system}, {"role": "user", "content": "question 0"}]
                match = httpx.post(f"{sizing_url}/v1/cache/match", json={"model": model, "messages": messages},
                                   timeout=60).json()
                working_set += int(match["prompt_tokens"])
            _stop(engines.pop()[1])
            pool_tokens = int(working_set * config.pool_share)
            for _ in range(num_replicas):
                port = free_port()
                engines.append((f"http://127.0.0.1:{port}", _spawn(_engine_command(config.model, port, pool_tokens),
                                                                     workdir / f"engine-{port}.log")))
            for url, process in engines:
                _wait_healthy(url, process)
            rng = random.Random(config.seed)
            order = [i for i in range(config.num_prompts) for _ in range(config.rounds)]
            rng.shuffle(order)
            sequence = [
                {
                    "model": model,
                    "messages": [{"role": "system", "content": systems[i]},
                                 {"role": "user", "content": f"question {n}"}],
                    "max_tokens": 1,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                for n, i in enumerate(order)
            ]
            urls = [url for url, _ in engines]
            for url in urls:  # the first forward passes of a process are slow: keep them out of both runs
                for n in range(3):
                    warm = {"model": model, "messages": [{"role": "user", "content": f"warm-up {n} " * 200}],
                            "max_tokens": 1}
                    httpx.post(f"{url}/v1/chat/completions", json=warm, timeout=600)
            by_policy = {
                policy: _run_policy(policy, urls, sequence, workdir) for policy in ("cache_aware", "round_robin")
            }
            aware, rr = by_policy["cache_aware"], by_policy["round_robin"]
            verdict = {
                "hit_rate_at_least_0.85": aware["token_hit_rate"] >= TARGET_HIT_RATE,
                "hit_rate_at_least_1.5x_round_robin": aware["token_hit_rate"] >= TARGET_RATIO * rr["token_hit_rate"],
                "ttft_p99_no_worse": aware["ttft_p99_ms"] <= rr["ttft_p99_ms"],
            }
            passed = passed and all(verdict.values())
            results[f"{num_replicas}_replicas"] = {
                "pool_tokens_each": pool_tokens,
                "working_set_tokens": working_set,
                **by_policy,
                "verdict": verdict,
            }
        finally:
            for _, process in engines:
                _stop(process)
    results["pass"] = passed
    from prefixscope.bench_report import emit

    return emit(results)
