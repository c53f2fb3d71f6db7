"""A synthetic but realistic trace, for benchmarks and demos: several tenants, each with a few long system prompts
(shared by all of that tenant's conversations), multi-turn conversations whose prompt grows by the last answer and
the next question every turn, interleaved in time, plus some prompts made unique by a volatile value at the start.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from db.simulation.trace import TraceRequest

REQUESTS_PER_SECOND = 20.0
ACTIVE_CONVERSATIONS = 64
MAX_CONVERSATION_BLOCKS = 2048


@dataclass(slots=True)
class _Conversation:
    system_prompt: list[int]
    turns_left: int
    history: list[int] = field(default_factory=list)


def synthetic_trace(num_blocks: int, seed: int = 0, block_size: int = 16, num_tenants: int = 6) -> list[TraceRequest]:
    """Requests in time order whose chains hold about `num_blocks` blocks of `block_size` tokens in all."""
    rng = random.Random(seed)

    def fresh(count: int) -> list[int]:
        return [rng.getrandbits(63) for _ in range(count)]

    # Block counts as at 16 tokens per block: system prompts of 0.5k-4k tokens, turns of 30-600 tokens.
    prompts = [[fresh(rng.randint(32, 256)) for _ in range(rng.randint(1, 3))] for _ in range(num_tenants)]
    weights = [1.0 / (rank + 1) for rank in range(num_tenants)]  # a few tenants send most of the traffic
    active: list[_Conversation] = []
    requests: list[TraceRequest] = []
    now_s = 0.0
    total = 0
    while total < num_blocks:
        now_s += rng.expovariate(REQUESTS_PER_SECOND)
        if len(active) < ACTIVE_CONVERSATIONS or rng.random() < 0.2:
            tenant = rng.choices(range(num_tenants), weights)[0]
            system_prompt = rng.choice(prompts[tenant])
            if rng.random() < 0.1:
                # A timestamp or request id early in the prompt: nothing after it can ever be shared.
                system_prompt = fresh(len(system_prompt))
            active.append(_Conversation(system_prompt, turns_left=rng.randint(1, 10)))
            index = len(active) - 1
        else:
            index = rng.randrange(len(active))
        conversation = active[index]
        conversation.history.extend(fresh(rng.randint(2, 40)))
        chain = conversation.system_prompt + conversation.history
        requests.append(
            TraceRequest(
                timestamp_s=now_s,
                input_length=len(chain) * block_size + rng.randrange(block_size),
                hash_ids=tuple(chain),
                block_size=block_size,
            )
        )
        total += len(chain)
        conversation.turns_left -= 1
        if conversation.turns_left == 0 or len(chain) > MAX_CONVERSATION_BLOCKS:
            active[index] = active[-1]
            active.pop()
    return requests
