"""Cache tiers and retention classes: the names every part of prefixscope uses for where KV lives and how long.

Tiers, fastest first: `device` (L1, the KV pool on the model's device: HBM on a GPU), `host` (L2, a second pool in
host DRAM: pinned on CUDA), `disk` (L3, one file per stored prefix under `--disk-cache-dir`). A radix node records the
fastest tier that holds its KV; eviction from a tier demotes to the next one; a match can span tiers and admission
loads the lower-tier part back into L1 slots.

Retention classes (the `cache_retention` body field, as the hosted APIs' 5-minute default vs longer retention):
`5m` and `1h` expire after that idle time in every tier; `persistent` is exempt from TTL and is the last to go.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final


class Tier(str, enum.Enum):
    DEVICE = "device"
    HOST = "host"
    DISK = "disk"


TIERS: Final = (Tier.DEVICE, Tier.HOST, Tier.DISK)  # fastest first; demotion moves one step right

HEADER_TIERS: Final = "x-prefix-cache-tiers"  # `device=N,host=N,disk=N` on every response

# The fields of each tier in the `/v1/cache` "tiers" object (and the `tier` label of `/metrics`), besides `enabled`:
# gauges (tokens, bytes) and monotonic counters (tokens, loads, ms, files).
TIER_GAUGES: Final = ("capacity_tokens", "cached_tokens", "free_tokens", "evictable_tokens", "protected_tokens",
                      "capacity_bytes")
TIER_COUNTERS: Final = ("hit_tokens_total", "loads_total", "load_tokens_total", "load_ms_total",
                        "demoted_tokens_total", "dropped_tokens_total", "corrupt_files_total")

# Idle lifetime in seconds of each retention class; None never expires.
RETENTION_TTL_S: Final[dict[str, float | None]] = {"5m": 300.0, "1h": 3600.0, "persistent": None}
RETENTION_CLASSES: Final = tuple(RETENTION_TTL_S)  # shortest first: a client may ask for less than its maximum


def retention_rank(retention: str) -> int:
    """Order of retention classes, shortest first; raises ValueError for an unknown class."""
    try:
        return RETENTION_CLASSES.index(retention)
    except ValueError:
        raise ValueError(f"unknown cache_retention {retention!r}; choose one of {list(RETENTION_CLASSES)}") from None


@dataclass(frozen=True, slots=True)
class TierTokens:
    """Matched prompt tokens by the tier that held their KV when the request was admitted (tokens)."""

    device: int = 0
    host: int = 0
    disk: int = 0

    @property
    def total(self) -> int:
        return self.device + self.host + self.disk

    def as_dict(self) -> dict[str, int]:
        return {"device": self.device, "host": self.host, "disk": self.disk}

    def header_value(self) -> str:
        return f"device={self.device},host={self.host},disk={self.disk}"

    @classmethod
    def parse_header(cls, value: str) -> TierTokens:
        """The inverse of `header_value`; raises ValueError on anything else."""
        parts = dict(item.split("=", 1) for item in value.split(",") if item.strip())
        if set(parts) != {tier.value for tier in TIERS}:
            raise ValueError(f"not a tiers header: {value!r}")
        counts = {name.strip(): int(count) for name, count in parts.items()}
        if min(counts.values()) < 0:
            raise ValueError(f"negative token count in {value!r}")
        return cls(**counts)
