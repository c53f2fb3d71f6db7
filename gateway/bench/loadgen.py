"""A small HTTP/1.1 load generator on raw asyncio sockets (keep-alive connections, no client library overhead).

Two modes, each printing one JSON object:
- `fixed`: open loop at `--rate` requests per second for `--duration` seconds (latency at a fixed load);
- `max`: closed loop, `--connections` connections each sending back to back (the highest sustained rate);
- `paired`: open loop of pairs, one request to `--direct-url` and one to `--url` each (`gateway.bench.paired`).

It runs in its own process so that it does not take the CPU of the server it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Tally:
    # Latencies of the successful (2xx) answers only: an error answer is neither throughput nor a served request.
    latencies_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    sent: int = 0
    failed: int = 0  # transport failures (no HTTP status)
    error_answers: int = 0  # answers with a 4xx or 5xx status

    def add(self, status: int, latency_s: float) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if 200 <= status < 300:
            self.latencies_s.append(latency_s)
        else:
            self.error_answers += 1


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values) + 0.5)) - 1))
    return sorted_values[index]


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def exchange(self, request: bytes) -> int:
        """Send one request, read the whole response; returns the status code."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        index = lower.find(b"content-length:")
        if index >= 0:
            end = lower.find(b"\r\n", index)
            await self.reader.readexactly(int(lower[index + 15 : end]))
        elif b"transfer-encoding: chunked" in lower:
            while True:
                size = int((await self.reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        return status

    def close(self) -> None:
        self.writer.close()


def build_request(url: str, body: bytes, api_key: str | None) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    headers = [
        f"POST {parts.path} HTTP/1.1",
        f"host: {host}:{port}",
        "content-type: application/json",
        f"content-length: {len(body)}",
    ]
    if api_key:
        headers.append(f"authorization: Bearer {api_key}")
    return host, port, ("\r\n".join(headers) + "\r\n\r\n").encode() + body


async def run_fixed(
    url: str, body: bytes, rate: float, duration_s: float, connections: int, api_key: str | None
) -> Tally:
    host, port, request = build_request(url, body, api_key)
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(await Connection.open(host, port))
    tally = Tally()
    tasks = []

    async def one() -> None:
        connection = await pool.get()
        start = time.perf_counter()
        try:
            status = await connection.exchange(request)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            tally.failed += 1
            connection.close()
            pool.put_nowait(await Connection.open(host, port))
            return
        tally.add(status, time.perf_counter() - start)
        pool.put_nowait(connection)

    total = int(rate * duration_s)
    begin = time.perf_counter()
    for index in range(total):
        delay = begin + index / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tally.sent += 1
        tasks.append(asyncio.ensure_future(one()))
    await asyncio.gather(*tasks)
    while not pool.empty():
        pool.get_nowait().close()
    return tally


async def run_max(url: str, body: bytes, duration_s: float, connections: int, api_key: str | None) -> Tally:
    host, port, request = build_request(url, body, api_key)
    tally = Tally()
    stop_at = time.perf_counter() + duration_s

    async def worker() -> None:
        connection = await Connection.open(host, port)
        try:
            while time.perf_counter() < stop_at:
                tally.sent += 1
                start = time.perf_counter()
                try:
                    status = await connection.exchange(request)
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    tally.failed += 1
                    connection.close()
                    connection = await Connection.open(host, port)
                    continue
                tally.add(status, time.perf_counter() - start)
        finally:
            connection.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    return tally


def summarize(tally: Tally, elapsed_s: float) -> dict[str, object]:
    latencies = sorted(tally.latencies_s)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000.0, 3)

    return {
        "sent": tally.sent,
        "completed": len(latencies),  # 2xx answers
        "failed": tally.failed,
        "error_answers": tally.error_answers,
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "elapsed_s": round(elapsed_s, 3),
        "rate_per_s": round(len(latencies) / elapsed_s, 1) if elapsed_s > 0 else None,  # 2xx answers per second
        "latency_ms": {
            "p50": ms(percentile(latencies, 0.50)),
            "p90": ms(percentile(latencies, 0.90)),
            "p99": ms(percentile(latencies, 0.99)),
            "max": ms(latencies[-1] if latencies else None),
        },
    }


def run_fast(coro: object) -> object:
    """asyncio.run on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=("fixed", "max", "paired"))
    parser.add_argument("--direct-url", default=None, help="paired mode: the upstream, sent to straight")
    parser.add_argument("--url", required=True)
    parser.add_argument("--body-file", required=True)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args(argv)
    with open(args.body_file, "rb") as handle:
        body = handle.read()
    begin = time.perf_counter()
    if args.mode == "paired":
        from gateway.bench.paired import run_paired, summarize_pairs

        pairs = run_fast(
            run_paired(args.direct_url, args.url, body, args.rate, args.duration, args.connections, args.api_key)
        )
        json.dump(summarize_pairs(pairs), sys.stdout)  # type: ignore[arg-type]
        return 0
    if args.mode == "fixed":
        tally = run_fast(run_fixed(args.url, body, args.rate, args.duration, args.connections, args.api_key))
    else:
        tally = run_fast(run_max(args.url, body, args.duration, args.connections, args.api_key))
    json.dump(summarize(tally, time.perf_counter() - begin), sys.stdout)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
