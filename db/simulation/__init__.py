"""What-if prefix-cache simulation over recorded block hash chains, and trace files in Mooncake's format.

`simulate(trace, capacity_tokens, policy, ttl_s)` replays a `Trace` through a prefix cache of that size with `lru`,
`fifo` or `optimal` (Belady) eviction and an optional TTL, and reports token and block hit rates; `sweep` runs a grid
of settings. `lru_curve` computes LRU's figures at every capacity in one pass (stack distances), for one cache or a
device tier with a host tier below it (`host_capacity_tokens`). `export_trace` writes stored chains (or any trace
requests) as JSON lines, `read_trace` reads them back. Pure Python: no web framework, no engine, no database driver;
`db.simulation.commands` reads the database.
"""

from db.simulation.simulator import POLICIES, SimulationResult, curve_result, simulate, sweep
from db.simulation.stack import LruCurve, TierCounts, lru_curve
from db.simulation.trace import Trace, TraceError, TraceRequest
from db.simulation.trace_io import export_trace, read_trace, read_trace_requests, trace_request_from_chain

__all__ = [
    "POLICIES",
    "LruCurve",
    "TierCounts",
    "SimulationResult",
    "Trace",
    "TraceError",
    "TraceRequest",
    "curve_result",
    "export_trace",
    "lru_curve",
    "read_trace",
    "read_trace_requests",
    "simulate",
    "sweep",
    "trace_request_from_chain",
]
