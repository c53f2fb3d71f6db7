"""Hypothesis strategies for the simulator's tests: random traces of hash chains, random unchained traces, TTLs."""

from __future__ import annotations

from hypothesis import strategies as st

from db.simulation import Trace, TraceRequest

TOKENS = st.lists(st.integers(0, 2), max_size=6)
# Whole and half seconds: TTL boundaries (idle exactly `ttl_s`) come up often.
TIMES = st.integers(0, 20).map(lambda half_seconds: half_seconds / 2)
TTLS = st.one_of(st.none(), st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.5, 4.0]))


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    """Chained traces over a three-token alphabet: shared prompts, conversations that grow, two tenants."""
    block_size = draw(st.integers(1, 3))
    bases = draw(st.lists(TOKENS, min_size=1, max_size=3))
    ids: dict[tuple[int, tuple[int, ...]], int] = {}
    requests = []
    for _ in range(draw(st.integers(0, 16))):
        tenant = draw(st.integers(0, 1))
        tokens = draw(st.sampled_from(bases)) + draw(TOKENS)
        bases.append(tokens)  # a later request may continue this one, as the next turn of a conversation
        chain = []
        for end in range(block_size, len(tokens) + 1, block_size):
            # Large, scattered ids, as real 63-bit hashes are; the same prefix in the same tenant gets the same id.
            chain.append(ids.setdefault((tenant, tuple(tokens[:end])), (len(ids) * 0x9E3779B97F4A7C15) % 2**63))
        requests.append(TraceRequest(draw(TIMES), len(tokens), tuple(chain), block_size))
    return Trace.from_requests(requests)


@st.composite
def unchained_traces(draw: st.DrawFn) -> Trace:
    """Chains of distinct ids in any order, as a trace file from elsewhere may hold: a block can sit at any depth."""
    block_size = draw(st.integers(1, 2))
    requests = [
        TraceRequest(draw(TIMES), draw(st.integers(0, 12)), tuple(chain), block_size)
        for chain in draw(st.lists(st.lists(st.integers(0, 6), max_size=5, unique=True), max_size=12))
    ]
    return Trace.from_requests(requests)
