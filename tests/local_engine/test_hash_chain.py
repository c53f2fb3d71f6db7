"""Block hash chains: equal hashes exactly where a whole prefix is shared, in the same namespace."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local_engine.cache.hash_chain import page_hash_chain

tokens = st.lists(st.integers(0, 3), max_size=40)


@settings(deadline=None)  # no timing assertion: a slow machine is not a failure
@given(tokens, tokens, st.sampled_from([1, 4, 16]))
def test_hash_i_is_shared_exactly_when_blocks_0_to_i_are(a, b, block_size):
    chain_a, chain_b = page_hash_chain("t", a, block_size), page_hash_chain("t", b, block_size)
    assert len(chain_a) == len(a) // block_size
    for i in range(min(len(chain_a), len(chain_b))):
        same_prefix = a[: (i + 1) * block_size] == b[: (i + 1) * block_size]
        assert (chain_a[i] == chain_b[i]) == same_prefix
        assert 0 <= chain_a[i] < 2**63


def test_namespaces_never_share_hashes():
    assert set(page_hash_chain("tenant-a", list(range(64)), 16)).isdisjoint(page_hash_chain("tenant-b", list(range(64)), 16))


def test_block_size_is_bounded():
    with pytest.raises(ValueError):
        page_hash_chain("t", [1, 2], 0)
