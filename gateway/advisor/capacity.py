"""The advisor's capacity: a CPU budget over a sliding window, a pace, and a limit on waiting estimates.

The sampler asks `has_room()` for every answered request; while the advisor's estimates used less than `cpu_budget`
of one core over the last `window_s` seconds and fewer than `max_pending` estimates are queued or running, the
request is sampled. So a quiet tenant is advised from its first requests, and a busy gateway spends at most about
`cpu_budget` of a core on advice (an estimate already queued may finish past the budget; the next waits until the
window has room again).

Every estimate's whole CPU time is charged: its steps on the event loop (dry-run payloads, their JSON, the HTTP
client's work) and the worker-thread parts (rewriting, matching, signatures), each measured with `time.thread_time()`
in the thread that did it. The pace spreads that work out: after an estimate that cost `c` CPU seconds the next one
starts no sooner than `c * (1 - cpu_budget) / cpu_budget` seconds later (`rest_s`), and a worker thread rests in the
same proportion after each rewrite (`rest_after`), so the advisor never holds the interpreter for long stretches
that the requests would have to wait out, even in a burst that the window alone would let through.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

# A share of one core: the core that also serves every request (one event loop), so whatever the advisor takes under
# full load comes off the gateway's throughput.
DEFAULT_CPU_BUDGET = 0.1
DEFAULT_WINDOW_S = 10.0
DEFAULT_MAX_PENDING = 8  # estimates queued or running


class AdvisorCapacity:
    """Whether the advisor may take one more sample; `charge` books the CPU seconds an estimate used."""

    def __init__(
        self,
        cpu_budget: float = DEFAULT_CPU_BUDGET,
        window_s: float = DEFAULT_WINDOW_S,
        max_pending: int = DEFAULT_MAX_PENDING,
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
        self._next_start = float("-inf")  # the clock's time before which the next estimate should not start
        self.cpu_s_total = 0.0

    def charge(self, cpu_s: float) -> None:
        """Book `cpu_s` CPU seconds spent now (and push the next estimate's start back by its rest)."""
        now = self._clock()
        self._charges.append((now, cpu_s))
        self._window_cpu_s += cpu_s
        self.cpu_s_total += cpu_s
        self._next_start = max(self._next_start, now) + self.rest_after(cpu_s)

    def rest_after(self, cpu_s: float) -> float:
        """Seconds to rest after `cpu_s` CPU seconds of work so the work stays within `cpu_budget` of a core
        (at most `window_s`)."""
        return min(self.window_s, max(0.0, cpu_s) * (1.0 - self.cpu_budget) / self.cpu_budget)

    def rest_s(self) -> float:
        """Seconds until the next estimate may start (0: now)."""
        return max(0.0, self._next_start - self._clock())

    def cpu_share(self) -> float:
        """CPU used over the last `window_s` seconds, as a share of one core."""
        horizon = self._clock() - self.window_s
        while self._charges and self._charges[0][0] < horizon:
            self._window_cpu_s -= self._charges.popleft()[1]
        if not self._charges:
            self._window_cpu_s = 0.0  # no rounding residue from the subtractions
        return max(0.0, self._window_cpu_s) / self.window_s

    def has_room(self, pending: int) -> bool:
        """True when one more estimate fits: under the CPU budget and fewer than `max_pending` queued or running."""
        return pending < self.max_pending and self.cpu_share() < self.cpu_budget
