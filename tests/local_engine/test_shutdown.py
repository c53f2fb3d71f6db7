"""SIGTERM on a real `prefixscope engine` process: no new requests, in-flight ones finish or are cancelled within
the grace period, and the process exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from .conftest import build_tiny_llama
from .server_fixtures import free_port, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


def _post(base_url: str, body: dict, results: dict, key: str) -> None:
    try:
        response = httpx.post(base_url + "/v1/completions", json=body, timeout=120)
        results[key] = (response.status_code, response.json())
    except httpx.HTTPError as exc:  # pragma: no cover - reported through the assertion below
        results[key] = (None, repr(exc))


def _ready(base_url: str) -> bool:
    try:
        return httpx.get(base_url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_sigterm_finishes_or_cancels_in_flight_requests_and_exits_zero(tmp_path, smollm2_tokenizer):
    model_dir = tmp_path / "tiny-llama"
    build_tiny_llama(len(smollm2_tokenizer)).save_pretrained(model_dir)
    smollm2_tokenizer.save_pretrained(model_dir)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "prefixscope", "engine", "--model", str(model_dir), "--device", "cpu",
         "--port", str(port), "--kv-cache-tokens", "8192", "--shutdown-grace-s", "3"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        assert wait_until(lambda: _ready(base_url) or process.poll() is not None, timeout_s=120)
        assert process.poll() is None, process.stdout.read().decode()
        results: dict = {}
        long_body = {"model": "tiny-llama", "prompt": [5, 6, 7, 8], "max_tokens": 4000, "ignore_eos": True}
        short_body = {"model": "tiny-llama", "prompt": [9, 10, 11], "max_tokens": 3, "ignore_eos": True}
        long_request = threading.Thread(target=_post, args=(base_url, long_body, results, "long"))
        long_request.start()
        assert wait_until(
            lambda: httpx.get(base_url + "/v1/cache", timeout=5).json()["active_requests"] == 1, timeout_s=60
        )
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        long_request.join(timeout=30)
        status, body = results["long"]
        # Still running when the grace period ended: cancelled, and the client is told why.
        assert status == 503 and body["error"]["type"] == "server_unavailable"
        output = process.stdout.read().decode()
        # The engine said it warmed up before it was ready, logged the request, and said what the stop drained.
        assert "engine warm-up took" in output and "engine ready" in output
        assert output.index("engine warm-up took") < output.index("engine ready")
        (line,) = [line for line in output.splitlines() if "access " in line and "/v1/completions" in line]
        assert " POST /v1/completions 503 prompt_tokens=4 cached_tokens=0 computed_tokens=4 " in line
        assert "engine stopped on SIGTERM: 1 running and 0 waiting request(s) at the signal; 0 finished within " \
               "the 3 s grace, 1 cancelled; drained in " in output
        # After the signal nothing new is admitted (the port is closed or the engine refuses).
        _post(base_url, short_body, results, "after")
        assert results["after"][0] in (None, 503)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
