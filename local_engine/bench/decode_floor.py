"""The physical floor of a decode step and how close the engine comes to it, for `prefixscope bench engine`.

A decode step reads every weight once and the KV of every context in the batch; at batch sizes this small it is
bound by memory bandwidth, so `bytes read / read bandwidth` is the least a step can take. The bandwidth is measured
here, on the machine and threads the engine uses: a sum over a 1 GiB tensor (the best of a few passes), on the CPU
with torch's thread count, on CUDA on the device. The bytes of a step: the weights (each stored tensor once, tied
embeddings counted once) plus the KV of the batch, a system prompt shared by several requests counted once (the
cascade path and FlashInfer read it once per step). Each concurrent run's measured inter-token latency (p50) is then
set beside its floor.
"""

from __future__ import annotations

import time

import torch

BANDWIDTH_PROBE_BYTES = 1 << 30


def read_bandwidth_gb_s(device: torch.device, num_bytes: int = BANDWIDTH_PROBE_BYTES, passes: int = 5) -> float:
    """The best of `passes` reads of a `num_bytes` float32 tensor on `device` (a `sum`), in GB/s (1e9 bytes/s)."""
    data = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(passes + 1):  # the first pass warms caches and the allocator
        _sync(device)
        started = time.perf_counter()
        data.sum()
        _sync(device)
        best = min(best, time.perf_counter() - started)
    del data
    return num_bytes / best / 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each storage once (tied embeddings share one)."""
    seen: dict[int, int] = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def step_kv_tokens(run: dict, num_prefixes: int) -> float:
    """The context tokens a decode step of a concurrent run reads, on average: the distinct system prompts in flight
    (`min(C, num_prefixes)`, the cached part of each request) once, plus each in-flight request's own tokens (its
    uncached prompt tail and, on average, half its answer)."""
    concurrency = run["concurrency"]
    shared = run["cached_tokens_mean"]
    own = run["prompt_tokens_mean"] - shared + run["max_tokens"] / 2
    return min(concurrency, num_prefixes) * shared + concurrency * own


def floor_section(engine, runs: list[dict], num_prefixes: int, bandwidth_gb_s: float) -> dict:
    """The floor beside each run's measured p50 inter-token latency: `{bandwidth_gb_s, weight_bytes, runs: [...]}`,
    each run with its bytes per step, floor (ms), measured ITL (ms) and their ratio."""
    weights = weight_bytes(engine.loaded.model)
    per_token = engine.pool.config.bytes_per_token
    rows = []
    for run in runs:
        kv = int(step_kv_tokens(run, num_prefixes) * per_token)
        floor_ms = (weights + kv) / (bandwidth_gb_s * 1e9) * 1000
        itl = run["itl_p50_ms"]
        rows.append({
            "concurrency": run["concurrency"],
            "max_tokens": run["max_tokens"],
            "weight_bytes": weights,
            "kv_bytes": kv,
            "bytes_per_step": weights + kv,
            "floor_ms": round(floor_ms, 2),
            "itl_p50_ms": itl,
            "itl_over_floor": round(itl / floor_ms, 2) if itl is not None else None,
        })
    return {"read_bandwidth_gb_s": round(bandwidth_gb_s, 2), "weight_bytes": weights, "kv_bytes_per_token": per_token,
            "runs": rows}


ITL_OVER_FLOOR_TARGET_C1 = 1.5


def floor_verdicts(section: dict) -> dict:
    """Target: at C=1, p50 inter-token latency <= ITL_OVER_FLOOR_TARGET_C1 x the floor (per max_tokens)."""
    verdicts = {}
    for row in section["runs"]:
        if row["concurrency"] == 1 and row["itl_over_floor"] is not None:
            verdicts[f"itl_over_floor_c1_max_tokens_{row['max_tokens']}"] = {
                "value": row["itl_over_floor"], "target": f"<= {ITL_OVER_FLOOR_TARGET_C1}",
                "pass": row["itl_over_floor"] <= ITL_OVER_FLOOR_TARGET_C1}
    return verdicts
