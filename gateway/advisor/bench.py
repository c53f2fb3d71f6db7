"""`prefixscope bench advise`: token hit rates of agent traffic under four rule sets, each beside the rule advisor's
estimate of it.

Processes: the engine (SmolLM2 on the CPU, unless `--engine` names a running one) and the gateway under uvicorn,
recording into a temporary SQLite database. Four tenants replay the same kind of agent sessions
(`gateway.advisor.traffic`), each with its own ids and times: all rules off, the default rules, and the default rules
plus `hoist_volatile` with each placement, with the default `advice_sample_rate` (the advisor samples every request
while it has capacity). The estimate beside a rule set comes from the tenant one step before it: "default rules" from
the all-off tenant's `default_rules` candidate, each `hoist_volatile` row from the default tenant's candidate. The
advisor's CPU share is its measured CPU seconds (the gateway's `/health`, `rule_advice.cpu_s`: thread time of its
rewriting, matching and signatures) over the replay's wall time, as a share of one core, beside the gateway process's
own CPU share. Passes when every estimate
is within 10 points of the measured rate, the default tenant's top recommendation is `hoist_volatile`, and the
advisor's CPU share is within its budget (`gateway.advisor.capacity.DEFAULT_CPU_BUDGET`).

Prints the table on standard error and one JSON document on standard output; exits 1 on FAIL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from gateway.advisor.capacity import DEFAULT_CPU_BUDGET
from gateway.advisor.traffic import interleaved_sessions

MODEL = "smollm2"
TOLERANCE = 0.10
# (tenant, what the table calls it, the tenant whose advice estimates it, the candidate)
ROWS = (
    ("off", "all rules off", None, None),
    ("default", "default rules (key order, tool order, newlines)", "off", "default_rules"),
    ("after_system", "+ hoist_volatile, placement after_system", "default", "hoist_volatile:after_system"),
    ("end", "+ hoist_volatile, placement end", "default", "hoist_volatile:end"),
)
CONFIG = """
[gateway]
host = "127.0.0.1"
port = {port}
server_secret = "bench-advise-secret"
secret_file = "{tmp}/secret"

[[upstreams]]
name = "engine"
url = "{engine}"
kind = "local_engine"
timeout = 600

[recorder]
spill_path = "{tmp}/spill.jsonl"

[tenant_defaults]
uplift_sample_rate = 0.0

[tenants.off]
rules = {{ newlines = false, tool_schema_key_order = false, tool_order = false, tool_call_arguments_key_order = false }}

[tenants.default]

[tenants.after_system]
rules = {{ hoist_volatile = true }}
hoist_placement = "after_system"

[tenants.end]
rules = {{ hoist_volatile = true }}
hoist_placement = "end"
"""


@dataclass(frozen=True)
class BenchConfig:
    sessions: int = 3
    turns: int = 6
    engine_url: str | None = None
    json_only: bool = False


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, process: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up")
        time.sleep(0.5)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def _replay(url: str, key: str, config: BenchConfig, seed: int) -> list[tuple[int, str]]:
    """(turn, request id) of every call."""
    sent = []
    with httpx.Client(timeout=600) as client:
        for _, turn, body in interleaved_sessions(config.sessions, config.turns, seed=seed):
            payload = {"model": MODEL, **body, "max_tokens": 1, "temperature": 0}
            headers = {"authorization": f"Bearer {key}"}
            response = client.post(f"{url}/v1/chat/completions", json=payload, headers=headers)
            response.raise_for_status()
            sent.append((turn, response.headers["x-request-id"]))
    return sent


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux `/proc/<pid>/stat`, fields 14 and 15; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _drained_advisor(url: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """The gateway's `rule_advice` figures once no estimate is pending."""
    deadline = time.monotonic() + timeout_s
    while True:
        figures = httpx.get(f"{url}/health", timeout=5).json()["rule_advice"]
        if figures["pending"] == 0 or time.monotonic() > deadline:
            return figures
        time.sleep(0.2)


def _rate(rows: list[Any]) -> float | None:
    prompt = sum(row.prompt_tokens or 0 for row in rows)
    return sum(row.cached_tokens or 0 for row in rows) / prompt if prompt else None


def run(config: BenchConfig) -> int:
    from sqlalchemy import select

    from db.engine import create_sync_engine_for
    from db.keys import create_api_key
    from db.migrate import upgrade
    from db.models import RequestRecordRow
    from db.queries.advice import advice
    from db.timeutil import utc_now

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="prefixscope-bench-advise-") as tmp:
        database_url = f"sqlite:///{tmp}/bench.db"
        started = time.perf_counter()
        try:
            engine_url = config.engine_url
            if engine_url is None:
                port = _free_port()
                engine_url = f"http://127.0.0.1:{port}"
                command = [sys.executable, "-m", "prefixscope", "engine", "--model", MODEL, "--device", "cpu"]
                command += ["--port", str(port), "--kv-cache-tokens", "65536", "--log-level", "warning"]
                quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
                processes.append(subprocess.Popen(command, env=env, **quiet))
                _wait_http(f"{engine_url}/health", processes[-1], 600)
            upgrade(database_url)
            store = create_sync_engine_for(database_url)
            keys = {tenant: create_api_key(store, tenant).plaintext_key for tenant, *_ in ROWS}
            gateway_port = _free_port()
            config_path = Path(tmp) / "prefixscope.toml"
            config_path.write_text(CONFIG.format(port=gateway_port, tmp=tmp, engine=engine_url), encoding="utf-8")
            command = [sys.executable, "-m", "prefixscope", "gateway", "--config", str(config_path)]
            command += ["--database-url", database_url, "--log-level", "warning"]
            gateway = subprocess.Popen(command, env=env)
            processes.append(gateway)
            gateway_url = f"http://127.0.0.1:{gateway_port}"
            _wait_http(f"{gateway_url}/health", gateway, 120)
            cpu_before = _process_cpu_s(gateway.pid)
            replay_started = time.perf_counter()
            sent = {
                tenant: _replay(gateway_url, keys[tenant], config, seed) for seed, (tenant, *_) in enumerate(ROWS)
            }
            advisor = _drained_advisor(gateway_url)
            replay_s = time.perf_counter() - replay_started
            gateway_cpu_s = _process_cpu_s(gateway.pid) - cpu_before
            _stop(gateway)  # the writer flushes every record, advice included
            with store.connect() as conn:
                rows = {row.id: row for row in conn.execute(select(RequestRecordRow))}
                found = {item.tenant: item for item in advice(conn, utc_now() - timedelta(days=1), min_samples=1)}
            store.dispose()
        finally:
            for process in reversed(processes):
                if process.poll() is None:
                    _stop(process)
    table = []
    for tenant, label, advised_by, candidate in ROWS:
        tenant_rows = [rows[request_id] for _, request_id in sent[tenant]]
        later = [rows[request_id] for turn, request_id in sent[tenant] if turn > 0]
        estimate = None
        if advised_by is not None and advised_by in found:
            by_key = {c.candidate: c for c in found[advised_by].candidates}
            if candidate in by_key:
                estimate = by_key[candidate].estimated_hit_rate
        table.append(
            {
                "tenant": tenant,
                "rules": label,
                "token_hit_rate": _rate(tenant_rows),
                "token_hit_rate_after_first_turn": _rate(later),
                "advisor_estimate": estimate,
                "estimated_from": None if advised_by is None else f"{advised_by}/{candidate}",
            }
        )
    default_advice = found.get("default")
    top = default_advice.recommendations[0].candidate if default_advice and default_advice.recommendations else None
    within = all(
        row["advisor_estimate"] is not None and abs(row["advisor_estimate"] - row["token_hit_rate"]) <= TOLERANCE
        for row in table
        if row["estimated_from"] is not None
    )
    advisor_share = advisor["cpu_s"] / replay_s if replay_s > 0 else 0.0
    within_budget = advisor_share <= DEFAULT_CPU_BUDGET
    passed = within and top is not None and top.startswith("hoist_volatile:") and within_budget
    result = {
        "benchmark": "advise",
        "sessions": config.sessions,
        "turns": config.turns,
        "rows": table,
        "default_tenant_top_recommendation": top,
        "advisor": {
            "sampled": advisor["sampled"],
            "skipped": advisor["skipped"],
            "cpu_s": advisor["cpu_s"],
            "cpu_share_of_one_core": round(advisor_share, 4),
            "gateway_cpu_share_of_one_core": round(gateway_cpu_s / replay_s, 4) if replay_s > 0 else None,
            "replay_wall_s": round(replay_s, 1),
        },
        "targets": {
            "estimate_within_points": 100 * TOLERANCE,
            "default_tenant_told": "hoist_volatile",
            "advisor_cpu_share_at_most": DEFAULT_CPU_BUDGET,
        },
        "wall_s": round(time.perf_counter() - started, 1),
        "verdict": "pass" if passed else "fail",
        "pass": passed,
    }
    if not config.json_only:
        print(_table(table), file=sys.stderr)
        print(
            f"advisor: {advisor['sampled']} sampled, {advisor['skipped']} skipped, {advisor['cpu_s']:.2f} CPU s = "
            f"{100 * advisor_share:.1f}% of one core over {replay_s:.0f} s (budget {100 * DEFAULT_CPU_BUDGET:.0f}%)",
            file=sys.stderr,
        )
    from prefixscope.bench_report import emit

    return emit(result)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| tenant rules | measured token hit rate | after first turn | advised (advisor's estimate) |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['rules']} | {_pct(row['token_hit_rate'])} | {_pct(row['token_hit_rate_after_first_turn'])} "
            f"| {_pct(row['advisor_estimate'])} |"
        )
    return "\n".join(lines)
