"""Torch's CPU threads in a serving process: one OpenMP pool, the engine worker's.

libgomp, the OpenMP runtime torch's CPU kernels and oneDNN run on, keeps a pool of threads for each thread that
starts parallel regions. While the process holds no more OpenMP threads than CPUs, a pool's threads spin between
regions and the next region starts at once; once it holds more (the main thread's pool, left from loading the model,
beside the engine worker's), every pool's threads sleep after a short spin (libgomp's throttled spin count), and each
of a decode step's hundreds of parallel regions pays a wake-up. On a 2-core Xeon, 30 bf16 matmuls of 3072x576 at one
row took 7.5 ms from the thread holding the process's only pool against 11.1 ms from a second thread, and a C=1
decode step of SmolLM2 with a 1.8k-token context 52 ms against 74.

So a process that serves runs torch with one thread everywhere but in the engine workers: `serialize_caller` is
called on the main thread before the model loads (loading and packing weights then take one core), each worker sets
`worker_threads()` at its start, and `on_worker_threads` runs other multi-threaded work (a benchmark's bandwidth
probe) on a short-lived thread whose pool ends with it. A process that never calls `serialize_caller` (tests, a
library user) keeps torch's behaviour: the workers use torch's thread count, whatever it is.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

_T = TypeVar("_T")
_worker_threads: int | None = None  # torch's thread count before serialize_caller lowered it


def serialize_caller() -> None:
    """From now on the calling thread runs torch with one thread (no OpenMP pool of its own); engine workers keep the
    count torch had (`worker_threads`). Call on the main thread before the model loads."""
    global _worker_threads
    if _worker_threads is None:
        _worker_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # A thread reads torch's count into its own OpenMP setting at its first parallel operation: do it now, while
    # the count is 1, so a worker raising the count later leaves this thread at one.
    torch.ones(1 << 16).sum()


def worker_threads() -> int:
    """The threads an engine worker runs torch with: torch's count before `serialize_caller`, else its count now."""
    return _worker_threads or torch.get_num_threads()


def claim_worker_threads() -> None:
    """Set the calling thread (an engine worker, at its start) to `worker_threads()` threads."""
    torch.set_num_threads(worker_threads())


def on_worker_threads(work: Callable[[], _T]) -> _T:
    """`work()` on a short-lived thread with `worker_threads()` threads, whose OpenMP pool ends with it; returns its
    result or raises its exception. Run it while no engine is running, or it competes with the worker's pool."""

    def run() -> _T:
        claim_worker_threads()
        return work()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-work") as pool:
        return pool.submit(run).result()
