"""Paired latency: each request through the gateway is paired with one straight to the upstream, sent back to back.

Subtracting independent percentiles of two runs (the gateway's p99 minus the upstream's p99, measured minutes apart
and under different load) can come out negative; a paired difference cannot be fooled that way. At a fixed rate of
pairs, each pair sends one request straight to the upstream and one through the gateway, one after the other, the
order alternating from pair to pair so neither side always goes first. The added latency is the distribution of the
per-pair differences (gateway - direct), in milliseconds.

`verdict` compares figures with stated targets and says pass or fail for each (and overall).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.bench.loadgen import Connection, build_request, percentile


@dataclass
class Pairs:
    """Latencies in seconds of the completed pairs (both sides 2xx), and the pairs that failed."""

    direct_s: list[float] = field(default_factory=list)
    gateway_s: list[float] = field(default_factory=list)
    sent: int = 0
    failed: int = 0


async def _timed(connection: Connection, request: bytes) -> tuple[int, float]:
    start = time.perf_counter()
    status = await connection.exchange(request)
    return status, time.perf_counter() - start


async def run_paired(
    direct_url: str,
    gateway_url: str,
    body: bytes,
    rate: float,
    duration_s: float,
    connections: int,
    api_key: str | None = None,
) -> Pairs:
    """Open loop at `rate` pairs per second for `duration_s`, over `connections` keep-alive connection pairs."""
    direct_host, direct_port, direct_request = build_request(direct_url, body, None)
    gateway_host, gateway_port, gateway_request = build_request(gateway_url, body, api_key)
    pool: asyncio.Queue[tuple[Connection, Connection]] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(
            (await Connection.open(direct_host, direct_port), await Connection.open(gateway_host, gateway_port))
        )
    pairs = Pairs()

    async def one(index: int) -> None:
        direct, through = await pool.get()
        try:
            if index % 2 == 0:
                direct_status, direct_s = await _timed(direct, direct_request)
                gateway_status, gateway_s = await _timed(through, gateway_request)
            else:
                gateway_status, gateway_s = await _timed(through, gateway_request)
                direct_status, direct_s = await _timed(direct, direct_request)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pairs.failed += 1
            direct.close()
            through.close()
            pool.put_nowait(
                (await Connection.open(direct_host, direct_port), await Connection.open(gateway_host, gateway_port))
            )
            return
        if direct_status < 300 and gateway_status < 300:
            pairs.direct_s.append(direct_s)
            pairs.gateway_s.append(gateway_s)
        else:
            pairs.failed += 1
        pool.put_nowait((direct, through))

    tasks = []
    begin = time.perf_counter()
    for index in range(int(rate * duration_s)):
        delay = begin + index / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        pairs.sent += 1
        tasks.append(asyncio.ensure_future(one(index)))
    await asyncio.gather(*tasks)
    while not pool.empty():
        for connection in pool.get_nowait():
            connection.close()
    return pairs


def _ms_quantiles(values_s: list[float]) -> dict[str, float | None]:
    ordered = sorted(values_s)
    return {
        name: None if (value := percentile(ordered, q)) is None else round(value * 1000.0, 3)
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
    }


def summarize_pairs(pairs: Pairs) -> dict[str, Any]:
    """Direct and gateway latency quantiles, and the distribution of the paired differences (ms)."""
    differences = [g - d for d, g in zip(pairs.direct_s, pairs.gateway_s, strict=True)]
    ordered = sorted(differences)
    return {
        "pairs_sent": pairs.sent,
        "pairs_completed": len(differences),
        "pairs_failed": pairs.failed,
        "direct_latency_ms": _ms_quantiles(pairs.direct_s),
        "gateway_latency_ms": _ms_quantiles(pairs.gateway_s),
        "added_latency_ms": {
            **_ms_quantiles(differences),
            "mean": round(statistics.fmean(differences) * 1000.0, 3) if differences else None,
            "min": round(ordered[0] * 1000.0, 3) if ordered else None,
            "max": round(ordered[-1] * 1000.0, 3) if ordered else None,
            # The share of pairs in which the gateway answered slower than the upstream alone.
            "share_positive": round(sum(d > 0 for d in differences) / len(differences), 4) if differences else None,
        },
    }


def verdict(measured: Mapping[str, float | None], targets: Mapping[str, float]) -> dict[str, Any]:
    """Pass or fail per target: a `*_max` target passes when the figure is at most it, a `*_min` one when at least.
    A missing figure fails."""
    results = {}
    for name, target in targets.items():
        value = measured.get(name)
        if value is None:
            passed = False
        elif name.endswith("_max"):
            passed = value <= target
        else:
            passed = value >= target
        results[name] = {"target": target, "measured": value, "pass": passed}
    return {"pass": all(result["pass"] for result in results.values()), "targets": results}
