"""Hand-made history for the Why misses and What-if pages: miss reasons, divergence places, sampled normalization
gains and block hash chains, with every figure the pages must show worked out by hand below."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from db.chains import RequestChain
from db.records import RequestRecord
from db.timeutil import utc_now

# Tokens lost (recomputed) and requests per reason, as the records below carry them.
LOST_BY_REASON = {"evicted": 800, "tools_changed": 300 + 200, "volatile_value": 500, "new_prefix": 0}
REQUESTS_BY_REASON = {"evicted": 1, "tools_changed": 2, "volatile_value": 1, "new_prefix": 1, "hit": 1}
TOKENS_LOST = 1800
BETA_TOKENS_LOST = 500 + 800
# Normalization was measured on r1 (gained 100 of 1000 prompt tokens), r2 (0 of 1000) and r4 (250 of 2000).
GAIN_TOKENS = 350
GAIN_SAMPLED = 3
GAIN_WITH_GAIN = 2
GAIN_SHARE = 350 / 4000

# Chains, in blocks of 4 tokens, 10 s apart (c4 hashed from text by the gateway):
#   c1 [1,2,3] 12 tokens, c2 [1,2,4] 13, c3 [1,2,3,5] 16, c4 [6,7] 8 (approximate), c5 [1,2,3,5] 16.
# With room for everything and no TTL every repeated block hits: c2 hits 1,2 (8 tokens), c3 1,2,3 (12), c5 all four
# (16): 36 of 65 prompt tokens.
CHAIN_BLOCK_SIZE = 4
CHAINS = (
    ((1, 2, 3), 12, False),
    ((1, 2, 4), 13, False),
    ((1, 2, 3, 5), 16, False),
    ((6, 7), 8, True),
    ((1, 2, 3, 5), 16, False),
)
CEILING_HIT_RATE = 36 / 65
# LRU with room for two blocks (8 tokens): c1 keeps only 1,2; c2 hits 1,2 (8); c3 hits 1,2 (8); c4 evicts both;
# c5 hits nothing: 16 of 65.
LRU_8_TOKENS_HIT_RATE = 16 / 65
NUM_CHAINS = 5
NUM_APPROXIMATE = 1


def _record(index: int, created_at: datetime, **fields: Any) -> RequestRecord:
    base: dict[str, Any] = {
        "request_id": f"why-{index:03d}",
        "created_at": created_at,
        "tenant": "alpha",
        "key_id": None,
        "endpoint": "chat.completions",
        "model": "m-small",
        "upstream": "local-engine",
        "stream": False,
        "status_code": 200,
        "error_type": None,
        "prompt_tokens": 1000,
        "cached_tokens": 0,
        "completion_tokens": 10,
        "ttft_ms": 50.0,
        "latency_ms": 100.0,
    }
    return RequestRecord(**(base | fields))


def explained_records(now: datetime | None = None) -> list[RequestRecord]:
    """Six explained requests (20 to 10 minutes ago) and five requests with chains (a few minutes ago)."""
    moment = (now or utc_now()) - timedelta(minutes=20)
    step = timedelta(minutes=1)
    records = [
        _record(1, moment, cached_tokens=990, miss_reason="hit", recomputed_tokens=0, normalization_gain_tokens=100),
        _record(
            2,
            moment + step,
            cached_tokens=100,
            miss_reason="tools_changed",
            divergence_segment="tools",
            divergence_char_offset=10,
            recomputed_tokens=300,
            normalization_gain_tokens=0,
            applied_rules=("canonical_tool_order",),
        ),
        _record(
            3,
            moment + 2 * step,
            cached_tokens=200,
            miss_reason="tools_changed",
            divergence_segment="tools",
            divergence_char_offset=70,
            recomputed_tokens=200,
        ),
        _record(
            4,
            moment + 3 * step,
            tenant="beta",
            prompt_tokens=2000,
            miss_reason="volatile_value",
            divergence_segment="system",
            divergence_char_offset=5,
            recomputed_tokens=500,
            normalization_gain_tokens=250,
        ),
        _record(5, moment + 4 * step, tenant="beta", miss_reason="evicted", recomputed_tokens=800),
        _record(6, moment + 5 * step, tenant="beta", miss_reason="new_prefix", recomputed_tokens=0),
    ]
    chain_start = moment + timedelta(minutes=10)
    for offset, (hash_ids, input_length, approximate) in enumerate(CHAINS):
        records.append(
            _record(
                100 + offset,
                chain_start + timedelta(seconds=10 * offset),
                prompt_tokens=input_length,
                chain=RequestChain(CHAIN_BLOCK_SIZE, input_length, hash_ids, approximate=approximate),
            )
        )
    return records
