"""The shared prefix-cache model (`db.cache_model`, which the simulator, the demo and the advisor ask) agrees with the
engine's RadixCache on a replayed trace: every request is served the same number of cached tokens.

The trace has shared system prompts, branching tails, two namespaces and idle gaps past the TTL, with room for
everything (under capacity pressure the engine evicts whole nodes and the model single blocks, so they part there).
Gaps never land exactly on the TTL: the engine expires a node idle for exactly `ttl_s`, the model keeps it."""

from __future__ import annotations

import random

import pytest

from db.cache_model import PrefixCacheModel
from local_engine.cache import RadixCache, RadixCacheConfig, SlotAllocator
from local_engine.hash_chain import page_hash_chain

PAGE = 4
TTL_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def trace(seed: int, num_requests: int) -> list[tuple[float, str, list[int]]]:
    rng = random.Random(seed)
    systems = [[rng.randrange(1, 500) for _ in range(rng.randrange(8, 40))] for _ in range(5)]
    earlier: list[list[int]] = []
    requests, now = [], 0.0
    for _ in range(num_requests):
        now += rng.choice((rng.uniform(0.1, 5.0), rng.uniform(0.1, 5.0), rng.uniform(TTL_S * 0.5, TTL_S * 1.5)))
        if earlier and rng.random() < 0.4:  # a later turn or a branch of an earlier prompt
            base = rng.choice(earlier)
            tail = [rng.randrange(1, 500) for _ in range(rng.randrange(0, 12))]
            tokens = base[: rng.randrange(1, len(base) + 1)] + tail
        else:
            tokens = rng.choice(systems) + [rng.randrange(1, 500) for _ in range(rng.randrange(1, 30))]
        earlier.append(tokens)
        requests.append((now, rng.choice(("tenant-a", "tenant-b")), tokens))
    return requests


@pytest.mark.parametrize("seed", [1, 2])
def test_the_model_serves_what_the_engine_serves(seed):
    clock = Clock()
    allocator = SlotAllocator(1 << 14)  # more than the trace ever holds: nothing is evicted
    engine = RadixCache(RadixCacheConfig(page_size=PAGE, ttl_s=TTL_S), allocator, clock=clock)
    model = PrefixCacheModel(None, ttl_s=TTL_S)
    served = []
    for index, (now, namespace, tokens) in enumerate(trace(seed, 300)):
        clock.now_s = now
        match = engine.match(namespace, tokens)
        slots = allocator.alloc(len(tokens))
        result = engine.insert(namespace, tokens, slots)
        allocator.free(slots[: result.num_cached_tokens])
        allocator.free(slots[result.num_stored_tokens :])
        if index % 50 == 0:
            engine.check_integrity()

        chain = page_hash_chain(namespace, tokens, PAGE)
        model.expire(now)
        predicted = min(model.leading_hits(chain) * PAGE, engine.max_matchable_tokens(len(tokens)))
        model.admit(chain, now)
        assert predicted == match.matched_tokens, (now, namespace, len(tokens))
        served.append(match.matched_tokens)
    assert engine.evicted_tokens_total == 0
    assert sum(1 for tokens in served if tokens) > 50 and model.expired_blocks > 0  # hits and expiries both seen
