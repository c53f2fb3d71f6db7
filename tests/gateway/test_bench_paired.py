"""`prefixscope bench gateway`'s paired latency and verdicts: each proxied request is paired with a direct one, the
added latency is the distribution of the differences, and every stated target gets a pass or a fail."""

from __future__ import annotations

import asyncio

from gateway.bench.paired import Pairs, run_paired, summarize_pairs, verdict


def test_the_added_latency_is_the_distribution_of_paired_differences():
    # Direct latencies swing between pairs (load); the gateway adds exactly 2 ms to each. Independent percentiles
    # would subtract a swing; paired differences do not.
    direct = [0.010, 0.050, 0.011, 0.090, 0.012]
    pairs = Pairs(direct_s=direct, gateway_s=[d + 0.002 for d in direct], sent=6, failed=1)
    summary = summarize_pairs(pairs)
    added = summary["added_latency_ms"]
    assert (added["p50"], added["p99"], added["min"], added["max"]) == (2.0, 2.0, 2.0, 2.0)
    assert added["mean"] == 2.0 and added["share_positive"] == 1.0
    assert (summary["pairs_sent"], summary["pairs_completed"], summary["pairs_failed"]) == (6, 5, 1)


def test_verdict_passes_and_fails_each_target():
    result = verdict(
        {"added_p50_ms_max": 0.4, "added_p99_ms_max": 7.5, "requests_per_s_min": 1200.0, "records_lost_max": None},
        {"added_p50_ms_max": 1.0, "added_p99_ms_max": 5.0, "requests_per_s_min": 1000.0, "records_lost_max": 0},
    )
    assert {name: r["pass"] for name, r in result["targets"].items()} == {
        "added_p50_ms_max": True, "added_p99_ms_max": False, "requests_per_s_min": True, "records_lost_max": False}
    assert result["pass"] is False
    assert verdict({"x_max": 1.0}, {"x_max": 1.0})["pass"] is True


async def _serve(delay_s: float) -> tuple[asyncio.AbstractServer, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                await asyncio.sleep(delay_s)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1/chat/completions"


def test_run_paired_sends_one_direct_and_one_proxied_request_per_pair():
    async def scenario() -> Pairs:
        direct_server, direct_url = await _serve(0.0)
        slower_server, slower_url = await _serve(0.02)
        try:
            return await run_paired(direct_url, slower_url, b"{}", rate=50.0, duration_s=0.4, connections=4)
        finally:
            direct_server.close()
            slower_server.close()

    pairs = asyncio.run(scenario())
    assert pairs.sent == 20 and pairs.failed == 0
    assert len(pairs.direct_s) == len(pairs.gateway_s) == 20
    # The second server (the "gateway" side) sleeps 20 ms before each answer: its latencies are paired to it.
    assert min(pairs.gateway_s) >= 0.02


def test_bench_gateway_listens_on_the_ports_it_is_given(monkeypatch) -> None:
    from gateway.bench import runner
    from prefixscope.cli import main

    seen = []
    monkeypatch.setattr(runner, "run", lambda config: seen.append(config) or 0)
    assert main(["bench", "gateway", "--duration", "1", "--port-base", "22010"]) == 0
    assert seen[0].ports() == (22010, 22011)
    assert main(["bench", "gateway", "--duration", "1"]) == 0
    assert seen[1].port_base is None and all(port > 0 for port in seen[1].ports())
