"""`prefixscope bench gateway`: measure what the gateway adds, and how much it can take, with recording on.

Processes: a stub upstream (answers at once), the gateway under uvicorn (recording into a temporary SQLite
database), and the load generator, each its own process so the client does not take the gateway's CPU. Steps:

1. latency at a fixed rate of pairs, each one request straight to the stub and one through the gateway back to back
   (alternating which goes first): the distribution of the paired differences is the added latency;
2. a closed-loop run through the gateway: the highest sustained request rate of one gateway process;
3. stop the gateway (its writer flushes) and check that every request sent has exactly one row, and how many rows
   carry a miss explanation, a (sampled) normalization gain and a hash chain (the stub answers like the engine);
4. with `--tracing` (before step 3), pairs of one request through that gateway and one through a second gateway
   exporting a span per request: what tracing adds (`gateway.bench.tracing`).

Prints one JSON document on standard output, with a `verdict` against the stated `TARGETS`; the PASS/FAIL lines go to
standard error (`prefixscope.bench_report`), and the exit status is 1 when any target is missed. Only 2xx answers
count as throughput; any 4xx or 5xx answer (or transport failure) fails `error_answers_max`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.bench.durability import measure_journal_append
from gateway.bench.paired import verdict
from prefixscope.bench_report import emit
from prefixscope.progress import timed

SYSTEM_PROMPT = (
    "You are the support assistant of an online shop. Answer briefly and politely. "
    "Use the tools to look up orders and products; never invent order numbers. " * 12
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Find an order by id.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_products",
            "description": "Full-text product search.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}},
        },
    },
]


# What the gateway must achieve on the bench's stub: added latency per paired request (gateway - direct), the
# closed-loop request rate of one gateway process, and no lost records.
TARGETS = {
    "added_p50_ms_max": 1.0,
    "added_p99_ms_max": 5.0,
    "requests_per_s_min": 1000.0,
    "records_lost_max": 0,
    "error_answers_max": 0,  # 4xx/5xx answers or transport failures in either run
    # spill_first is the default only while its request-path cost (journal append) stays under this.
    "spill_first_added_p50_ms_max": 0.2,
}


@dataclass(frozen=True)
class BenchConfig:
    rate_per_s: float = 200.0
    duration_s: float = 10.0
    num_connections: int = 64
    stream: bool = False
    warmup_s: float = 2.0
    durability: str = "spill_first"  # the gateway's [recorder] durability mode
    port_base: int | None = None  # stub upstream on this port, gateway on the next; free ports when None
    tracing: bool = False  # also measure a gateway exporting request spans (`gateway.bench.tracing`)

    def ports(self) -> tuple[int, int]:
        """The stub upstream's and the gateway's ports."""
        if self.port_base is None:
            return _free_port(), _free_port()
        return self.port_base, self.port_base + 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_http(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up")
        time.sleep(0.1)


def _loadgen(
    mode: str,
    url: str,
    body_file: Path,
    config: BenchConfig,
    *,
    duration_s: float,
    connections: int,
    direct_url: str | None = None,
) -> dict[str, Any]:
    extra = [] if direct_url is None else ["--direct-url", direct_url]
    command = [
        sys.executable,
        "-m",
        "gateway.bench.loadgen",
        mode,
        "--url",
        url,
        "--body-file",
        str(body_file),
        "--rate",
        str(config.rate_per_s),
        "--duration",
        str(duration_s),
        "--connections",
        str(connections),
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def _records(url: str) -> dict[str, int]:
    return httpx.get(f"{url}/health", timeout=10).json()["records"]


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux /proc), or None where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_us_per_request(before: float | None, after: float | None, requests: int) -> float | None:
    if before is None or after is None or requests <= 0:
        return None
    return round((after - before) / requests * 1e6, 1)


def _count_rows(db_path: Path) -> int:
    import sqlite3

    with sqlite3.connect(db_path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0])


def _count_explained(db_path: Path) -> dict[str, int]:
    """How many stored requests carry a miss reason, a normalization gain (sampled) and a hash chain."""
    import sqlite3

    with sqlite3.connect(db_path) as conn:
        reasons, gains = conn.execute(
            "SELECT COUNT(miss_reason), COUNT(normalization_gain_tokens) FROM requests"
        ).fetchone()
        chains = conn.execute("SELECT COUNT(*) FROM request_chains").fetchone()[0]
    return {"with_miss_reason": int(reasons), "with_normalization_gain": int(gains), "with_hash_chain": int(chains)}


def _start_gateway(
    config_file: Path, port: int, stub_url: str, db_path: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "prefixscope", "gateway", "--config", str(config_file), "--port", str(port)]
    command += ["--upstream", stub_url, "--database-url", f"sqlite:///{db_path}", "--log-level", "warning", "--open"]
    return subprocess.Popen(command, env=env)


def _traced_run(
    config: BenchConfig,
    workdir: Path,
    stub_url: str,
    untraced_url: str,
    body_file: Path,
    env: dict[str, str],
    processes: list[subprocess.Popen[bytes]],
) -> dict[str, Any]:
    """Pairs of one request through the gateway without spans and one through a second gateway exporting a span per
    request to the stub's OTLP endpoint: the paired differences are what tracing adds, with the machine's load
    falling on both sides alike."""
    from gateway.bench.tracing import measure_request_path, span_counts, telemetry_section

    config_file = workdir / "gateway-traced.toml"
    config_file.write_text(
        (workdir / "gateway.toml").read_text() + telemetry_section(stub_url, workdir / "traced_key_snapshot.json")
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    gateway = _start_gateway(config_file, port, stub_url, workdir / "traced.db", env)
    processes.append(gateway)
    _wait_http(f"{url}/health")
    chat = "/v1/chat/completions"
    _loadgen("fixed", url + chat, body_file, config, duration_s=config.warmup_s, connections=16)
    paired = _loadgen(
        "paired", url + chat, body_file, config, duration_s=config.duration_s, connections=16,
        direct_url=untraced_url + chat,
    )
    time.sleep(1.0)  # the batch processor exports every 0.5 s
    counts = span_counts(httpx.get(f"{url}/metrics", timeout=10).text)
    gateway.send_signal(signal.SIGTERM)
    gateway.wait(timeout=120)
    return {"paired": paired, "request_path": measure_request_path(stub_url), "gateway_spans": counts}


def run(config: BenchConfig) -> int:
    load_start = round(os.getloadavg()[0], 2)
    workdir = Path(tempfile.mkdtemp(prefix="prefixscope-bench-"))
    stub_port, gateway_port = config.ports()
    stub_url = f"http://127.0.0.1:{stub_port}"
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    db_path = workdir / "bench.db"
    body = {
        "model": "bench",
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "Where is my order 12345?"},
        ],
        "tools": TOOLS,
        "max_tokens": 8,
        "stream": config.stream,
    }
    body_file = workdir / "body.json"
    body_file.write_bytes(json.dumps(body).encode())
    config_file = workdir / "gateway.toml"
    config_file.write_text(
        f'[gateway]\nsecret_file = "{workdir / "secret"}"\n\n[recorder]\nspill_path = "{workdir / "spill.jsonl"}"\n'
        f'durability = "{config.durability}"\n'
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PREFIXSCOPE_DATABASE_URL", None)
    processes: list[subprocess.Popen[bytes]] = []
    clock = timed("bench gateway", config.warmup_s + 3 * config.duration_s)
    try:
        processes.append(
            subprocess.Popen([sys.executable, "-m", "gateway.bench.stub", "--port", str(stub_port)], env=env)
        )
        _wait_http(f"{stub_url}/health")
        gateway = _start_gateway(config_file, gateway_port, stub_url, db_path, env)
        processes.append(gateway)
        _wait_http(f"{gateway_url}/health")
        chat = "/v1/chat/completions"
        sent_to_gateway = 0
        clock.start()
        warm = _loadgen("fixed", gateway_url + chat, body_file, config, duration_s=config.warmup_s, connections=16)
        sent_to_gateway += warm["sent"]
        cpu_before_fixed = _cpu_seconds(gateway.pid)
        paired = _loadgen(
            "paired",
            gateway_url + chat,
            body_file,
            config,
            duration_s=config.duration_s,
            connections=16,
            direct_url=stub_url + chat,
        )
        cpu_after_fixed = _cpu_seconds(gateway.pid)
        sent_to_gateway += paired["pairs_sent"]
        before = _records(gateway_url)
        started = time.perf_counter()
        cpu_before_peak = _cpu_seconds(gateway.pid)
        peak = _loadgen(
            "max",
            gateway_url + chat,
            body_file,
            config,
            duration_s=config.duration_s,
            connections=config.num_connections,
        )
        cpu_after_peak = _cpu_seconds(gateway.pid)
        peak_elapsed = time.perf_counter() - started
        clock.stop()
        after = _records(gateway_url)
        sent_to_gateway += peak["sent"]
        traced = None
        if config.tracing:
            traced = _traced_run(config, workdir, stub_url, gateway_url, body_file, env, processes)
            sent_to_gateway += traced["paired"]["pairs_sent"]  # each pair also sent one request to this gateway
        drain_started = time.perf_counter()
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(timeout=120)
        drain_s = time.perf_counter() - drain_started
        stored = _count_rows(db_path)
        explained = _count_explained(db_path)
    finally:
        clock.stop(completed=False)
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=30)

    report = {
        "benchmark": "gateway",
        "request": {"bytes": body_file.stat().st_size, "stream": config.stream, "tools": len(TOOLS)},
        "durability": {"mode": config.durability, "spill_first_request_path": measure_journal_append()},
        "cpu_count": os.cpu_count(),
        # Other processes on the machine compete for the same cores; latency tails are sensitive to it.
        "load_avg_1m": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
        # Pairs at a fixed rate: each request through the gateway is paired with one straight to the stub, sent back
        # to back in alternating order; `added_latency_ms` is the distribution of the per-pair differences.
        "paired": {
            "pairs_per_s": config.rate_per_s,
            "duration_s": config.duration_s,
            **paired,
            # CPU the gateway process (event loop and database writer together) spent per request.
            "gateway_cpu_us_per_request": _cpu_us_per_request(
                cpu_before_fixed, cpu_after_fixed, paired["pairs_completed"]
            ),
        },
        "max_rate": {
            "connections": config.num_connections,
            "requests_per_s": peak["rate_per_s"],
            "latency_ms": peak["latency_ms"],
            "statuses": peak["statuses"],
            "error_answers": peak["error_answers"],
            "failed": peak["failed"],
            "gateway_cpu_us_per_request": _cpu_us_per_request(cpu_before_peak, cpu_after_peak, peak["completed"]),
            "records_written_per_s": round((after["written"] - before["written"]) / peak_elapsed, 1),
            "records_queued_at_end": after["queued"],
        },
        "records": {
            "sent": sent_to_gateway,
            "stored": stored,
            "lost": sent_to_gateway - stored,
            "dropped": after["dropped"],
            "spilled": after["spilled"],
            "shutdown_drain_s": round(drain_s, 3),
            "explained": explained,
        },
    }
    added = paired["added_latency_ms"]
    measured = {
        "added_p50_ms_max": added["p50"],
        "added_p99_ms_max": added["p99"],
        "requests_per_s_min": peak["rate_per_s"],
        "records_lost_max": sent_to_gateway - stored,
        "error_answers_max": peak["error_answers"] + peak["failed"] + paired["pairs_failed"],
        "spill_first_added_p50_ms_max": report["durability"]["spill_first_request_path"]["p50_us"] / 1000,
    }
    targets = dict(TARGETS)
    if traced is not None:
        from gateway.bench.tracing import TRACING_TARGETS, tracing_report

        report["tracing"] = tracing_report(traced["paired"], traced["request_path"], traced["gateway_spans"])
        measured["tracing_added_p50_ms_max"] = report["tracing"]["tracing_added_p50_ms"]
        targets.update(TRACING_TARGETS)
    report["verdict"] = verdict(measured, targets)
    return emit(report)
