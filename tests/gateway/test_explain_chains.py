"""Hash chains: reading the engine's, hashing approximate ones from text, and keeping them from clients."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from db.chains import RequestChain
from gateway.explain.chains import (
    CHARS_PER_TOKEN,
    approximate_chain,
    body_without_hash_chain,
    canonical_prompt_text,
    engine_chain,
    strip_hash_chain,
)


def test_engine_chain_is_read_exactly():
    prefix_cache = {"matched_tokens": 3, "hash_chain": {"block_size": 16, "input_length": 40, "hash_ids": [5, 6]}}
    assert engine_chain(prefix_cache) == RequestChain(16, 40, (5, 6), approximate=False)


def test_malformed_or_missing_engine_chains_are_none():
    for prefix_cache in (
        None,
        {},
        {"hash_chain": None},
        {"hash_chain": {"block_size": 0, "input_length": 1, "hash_ids": []}},
        {"hash_chain": {"block_size": 16, "input_length": 1, "hash_ids": ["x"]}},
        {"hash_chain": {"block_size": 16, "input_length": 1, "hash_ids": [2**63]}},
        {"hash_chain": {"block_size": 16, "hash_ids": []}},
    ):
        assert engine_chain(prefix_cache) is None


def test_canonical_text_renders_tools_then_roles_and_texts():
    body = {
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
        ],
    }
    text = canonical_prompt_text("chat.completions", body)
    assert text.index('"name":"f"') < text.index("Be brief.") < text.index("hi there")
    assert canonical_prompt_text("completions", {"prompt": ["Once"]}) == "Once"


def test_approximate_chains_share_hashes_exactly_as_far_as_the_text():
    block_size = 4
    chunk = block_size * CHARS_PER_TOKEN
    base = "x" * (chunk * 5)
    a = approximate_chain(base, "salt", block_size, None)
    b = approximate_chain(base[: chunk * 3] + "y" + base[chunk * 3 + 1 :], "salt", block_size, 99)
    assert a.approximate and a.num_blocks == 5 and a.input_length == len(base) // CHARS_PER_TOKEN
    assert b.input_length == 99
    assert a.hash_ids[:3] == b.hash_ids[:3] and a.hash_ids[3] != b.hash_ids[3]
    assert approximate_chain(base, "other tenant", block_size, None).hash_ids[0] != a.hash_ids[0]


@settings(deadline=None)  # no timing assertion: a slow machine is not a failure
@given(st.text(max_size=400), st.integers(1, 32))
def test_approximate_chain_length_and_range(text, block_size):
    chain = approximate_chain(text, "s", block_size, None)
    assert chain.num_blocks == len(text.encode("utf-8", "surrogatepass")) // (block_size * CHARS_PER_TOKEN)
    assert all(0 <= value < 2**63 for value in chain.hash_ids)
    assert chain == approximate_chain(text, "s", block_size, None)


def test_hash_chain_is_removed_from_what_clients_see():
    body = {"id": "x", "prefix_cache": {"matched_tokens": 1, "hash_chain": {"block_size": 16}}}
    assert strip_hash_chain(body) == {"id": "x", "prefix_cache": {"matched_tokens": 1}}
    assert body["prefix_cache"]["hash_chain"] == {"block_size": 16}  # the input is untouched
    plain = {"id": "x", "prefix_cache": {"matched_tokens": 1}}
    assert strip_hash_chain(plain) is plain
    assert json.loads(body_without_hash_chain(json.dumps(body).encode())) == strip_hash_chain(body)
    assert body_without_hash_chain(b"not json") == b"not json"
