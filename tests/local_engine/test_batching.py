"""Continuous batching: packed mixed batches compute what each request computes alone, and the scheduler keeps the
cache's books straight through arrivals, cancellations, preemptions and evictions."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from local_engine.cache import KVPool, SlotAllocator
from local_engine.config import EngineConfig
from local_engine.prompt.detokenizer import IncrementalDetokenizer
from local_engine.engine.engine import Engine
from local_engine.engine.types import Finished, GenerationRequest, RequestHandle, TokenDelta
from local_engine.model.runner import ModelRunner, ScheduledChunk
from local_engine.engine.sampling import Sampler, SamplingParams
from local_engine.engine.sequence import Sequence

from .conftest import run_to_end


def token_ids(seed: int, length: int, vocab: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (length,), generator=generator).tolist()


def assert_mixed_batch_equals_alone_and_full_recompute(model, vocab: int, lengths: list[int]) -> None:
    """Requests of the given lengths: some on a cached prefix, some prefilling in chunks, some decoding, all in one
    packed step; each one's logits must equal its own batch of one and a full recompute without any cache."""
    runner = ModelRunner(model, KVPool(ModelRunner.pool_config_for(model, torch.device("cpu"), torch.float32), 4096))
    allocator = SlotAllocator(4096)
    rng = random.Random(0)
    sequences = [token_ids(100 + i, n, vocab) for i, n in enumerate(lengths)]
    # Slot tables are scattered over the pool, as they are after evictions.
    tables = [allocator.alloc(n)[torch.randperm(n, generator=torch.Generator().manual_seed(i))]
              for i, n in enumerate(lengths)]
    with torch.inference_mode():
        full = [model(input_ids=torch.tensor([s])).logits[0].float() for s in sequences]
    # Before the mixed step, each request has some of its tokens in the pool already:
    # a cached prefix (computed earlier), nothing at all, or all but the last (decoding).
    done = []
    for i, sequence in enumerate(sequences):
        kind = i % 3
        already = {0: rng.randrange(1, len(sequence) - 1), 1: 0, 2: len(sequence) - 1}[kind]
        if already:
            runner.forward([ScheduledChunk(sequence[:already], tables[i][:already], False)])
        done.append(already)
    # The mixed step: decoders take one token; the others a chunk that ends inside or at the end of the sequence.
    ends = [len(s) if i % 2 == 0 or done[i] == len(s) - 1 else rng.randrange(done[i] + 1, len(s))
            for i, s in enumerate(sequences)]
    chunks = [ScheduledChunk(s[done[i] : ends[i]], tables[i][: ends[i]], True) for i, s in enumerate(sequences)]
    batched = runner.forward(chunks)
    for i, chunk in enumerate(chunks):
        alone = runner.forward([chunk])[0]
        assert (batched[i] - alone).abs().max().item() <= 1e-4
        assert (batched[i] - full[i][ends[i] - 1]).abs().max().item() <= 1e-4


@pytest.mark.model_forward
def test_a_mixed_batch_equals_each_request_alone_and_a_full_recompute_on_the_tiny_model(tiny_loaded):
    lengths = [37, 120, 9, 64, 200, 18, 150, 3, 90]
    assert_mixed_batch_equals_alone_and_full_recompute(tiny_loaded.model, len(tiny_loaded.tokenizer), lengths)


@pytest.mark.real_model
def test_a_mixed_batch_equals_each_request_alone_and_a_full_recompute_on_smollm2(smollm2_loaded):
    lengths = [60, 210, 12, 95, 140, 33]
    assert_mixed_batch_equals_alone_and_full_recompute(smollm2_loaded.model, 49152, lengths)


@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_output_is_the_same_alone_and_in_a_batch_of_8(make_engine, page_size):
    engine = make_engine(kv_cache_tokens=8192, page_size=page_size, max_num_seqs=8, max_num_batched_tokens=64)
    shared = token_ids(7, 70, 49152)
    prompts = [tuple(shared[: 40 + 3 * i] + token_ids(200 + i, 5 + 11 * i, 49152)) for i in range(8)]
    params = [SamplingParams(max_tokens=6 + 3 * i, temperature=0.0, ignore_eos=True) for i in range(8)]

    async def alone():
        return [(await run_to_end(engine, GenerationRequest(p, s)))[1] for p, s in zip(prompts, params)]

    async def together():
        results = await asyncio.gather(*(run_to_end(engine, GenerationRequest(p, s)) for p, s in zip(prompts, params)))
        return [text for _, text, _ in results], [f.completion_tokens for _, _, f in results]

    expected = asyncio.run(alone())
    engine.flush_cache()
    steps_before = engine.num_steps
    texts, counts = asyncio.run(together())
    assert texts == expected
    assert counts == [s.max_tokens for s in params]
    # 8 requests decoding together: far fewer steps than one per generated token.
    assert engine.num_steps - steps_before < sum(counts) // 2
    engine.check_integrity()
    assert engine.cache.protected_tokens == 0


def _direct_sequence(engine: Engine, loop, prompt: list[int], max_tokens: int, seed: int) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0 if seed % 2 else 0.8, seed=seed, ignore_eos=True)
    return Sequence(
        request=GenerationRequest(tuple(prompt), params, namespace=f"ns{seed % 2}"),
        handle=RequestHandle(loop),
        detokenizer=IncrementalDetokenizer(engine.loaded.tokenizer, ()),
        sampler=Sampler(params),
    )


@pytest.mark.parametrize("page_size", [1, 16])
def test_randomized_scheduling_keeps_the_cache_consistent_after_every_step(tiny_loaded, page_size):
    """Arrivals, cancellations, preemptions and evictions, driven step by step (no worker thread)."""
    engine = Engine(
        EngineConfig(kv_cache_tokens=300, page_size=page_size, max_num_seqs=6, max_num_batched_tokens=64),
        tiny_loaded,
    )
    loop = asyncio.new_event_loop()
    rng = random.Random(page_size)
    bases = [token_ids(300 + i, 100, 49152) for i in range(3)]
    sequences: list[Sequence] = []
    for step in range(300):
        if len(sequences) < 16 and rng.random() < 0.4:
            base = bases[rng.randrange(3)]
            prompt = base[: rng.randrange(10, 70)] + token_ids(1000 + len(sequences), rng.randrange(1, 10), 49152)
            sequence = _direct_sequence(engine, loop, prompt, rng.randrange(40, 80), len(sequences))
            sequences.append(sequence)
            engine.scheduler.add(sequence)
        if sequences and rng.random() < 0.05:
            rng.choice(sequences).handle.cancel()
        if rng.random() < 0.02:
            engine.flush_cache()
        engine.step()
        engine.check_integrity()
        if len(sequences) == 16 and not engine.scheduler.has_work():
            break
    while engine.scheduler.has_work():
        engine.step()
        engine.check_integrity()
    loop.run_until_complete(asyncio.sleep(0))
    assert engine.counters.preemptions > 0
    assert engine.cache.stats().evicted_tokens_total > 0
    assert engine.cache.protected_tokens == 0
    assert engine.allocator.num_free + engine.cache.cached_tokens == 300
    for sequence in sequences:
        events = []
        while not sequence.handle.events.empty():
            events.append(sequence.handle.events.get_nowait())
        if sequence.handle.cancelled:
            continue
        assert isinstance(events[-1], Finished) and events[-1].finish_reason == "length"
        generated = [t for event in events if isinstance(event, TokenDelta) for t in event.token_ids]
        assert len(generated) == sequence.request.sampling.max_tokens == events[-1].completion_tokens
        if sequence.sampler.is_greedy:
            # Preempted or not, a greedy answer is what the model gives with everything recomputed.
            assert generated == greedy_by_full_recompute(tiny_loaded.model, sequence.prompt, len(generated))
    loop.close()


def greedy_by_full_recompute(model, prompt, num_tokens: int) -> list[int]:
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(num_tokens):
            ids.append(int(model(input_ids=torch.tensor([ids]), logits_to_keep=1).logits[0, -1].argmax()))
    return ids[len(prompt) :]
