"""A serving process keeps one OpenMP pool: the main thread runs torch alone after `serialize_caller`, a worker gets
torch's former thread count, and the pool of a short-lived worker ends with it. Each case runs in a fresh
interpreter, since the calls change process-wide torch settings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_PROBE = r"""
import json, os, time, torch
from local_engine.engine.compute_threads import on_worker_threads, serialize_caller, worker_threads

def threads():
    return len(os.listdir("/proc/self/task"))

def matmul():
    a = torch.randn(1024, 1024)
    for _ in range(3):
        a = a @ a / 1024
    return a

before = torch.get_num_threads()
serialize_caller()
idle = threads()
matmul()
on_main = threads()
inside = on_worker_threads(lambda: (torch.get_num_threads(), matmul() is not None and threads()))
for _ in range(200):  # the ended pool's threads exit on their own, soon after their thread
    if threads() == idle:
        break
    time.sleep(0.05)
print(json.dumps({"before": before, "main_count": torch.get_num_threads(), "worker_threads": worker_threads(),
                  "idle": idle, "on_main": on_main, "worker_count": inside[0], "inside": inside[1],
                  "after": threads()}))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_main_thread_runs_torch_alone(probe):
    assert probe["main_count"] == 1
    assert probe["on_main"] == probe["idle"]  # a matmul on the main thread started no OpenMP thread


def test_a_worker_gets_the_count_torch_had(probe):
    assert probe["worker_threads"] == probe["before"]
    assert probe["worker_count"] == probe["before"]


def test_a_short_lived_workers_pool_ends_with_it(probe):
    if probe["before"] > 1:
        # the worker itself and its pool's other threads
        assert probe["inside"] >= probe["idle"] + probe["before"]
    assert probe["after"] == probe["idle"]
