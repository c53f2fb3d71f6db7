"""The advisor's capacity: a CPU budget over a sliding window, and a concurrency limit.

The sampler asks `has_room()` for every answered request; while the advisor's estimates used less than `cpu_budget`
of one core over the last `window_s` seconds and fewer than `max_pending` estimates are queued or running, the
request is sampled. So a quiet tenant is advised from its first requests, and a busy gateway spends at most about
`cpu_budget` of a core on advice (an estimate already started may finish past the budget; the next waits until the
window has room again). CPU time is measured per estimate with `time.thread_time()` in the worker thread that does
the rewriting and matching, the advisor's only CPU-heavy part (dry runs are I/O on the event loop).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

DEFAULT_CPU_BUDGET = 0.25  # share of one core
DEFAULT_WINDOW_S = 10.0


class AdvisorCapacity:
    """Whether the advisor may take one more sample; `charge` books the CPU seconds an estimate used."""

    def __init__(
        self,
        cpu_budget: float = DEFAULT_CPU_BUDGET,
        window_s: float = DEFAULT_WINDOW_S,
        max_pending: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < cpu_budget <= 1:
            raise ValueError("cpu_budget must be in (0, 1] (a share of one core)")
        if window_s <= 0 or max_pending < 1:
            raise ValueError("window_s must be positive and max_pending at least 1")
        self.cpu_budget = cpu_budget
        self.window_s = window_s
        self.max_pending = max_pending
        self._clock = clock
        self._charges: deque[tuple[float, float]] = deque()  # (when, cpu seconds)
        self._window_cpu_s = 0.0
        self.cpu_s_total = 0.0

    def charge(self, cpu_s: float) -> None:
        """Book `cpu_s` CPU seconds spent now."""
        self._charges.append((self._clock(), cpu_s))
        self._window_cpu_s += cpu_s
        self.cpu_s_total += cpu_s

    def cpu_share(self) -> float:
        """CPU used over the last `window_s` seconds, as a share of one core."""
        horizon = self._clock() - self.window_s
        while self._charges and self._charges[0][0] < horizon:
            self._window_cpu_s -= self._charges.popleft()[1]
        if not self._charges:
            self._window_cpu_s = 0.0  # no rounding residue from the subtractions
        return max(0.0, self._window_cpu_s) / self.window_s

    def has_room(self, pending: int) -> bool:
        """True when one more estimate fits: under the CPU budget and fewer than `max_pending` in flight."""
        return pending < self.max_pending and self.cpu_share() < self.cpu_budget
