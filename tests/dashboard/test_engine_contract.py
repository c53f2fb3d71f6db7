"""The engine's real cache views read by the dashboard's client code: a contract test between the two packages.

The dashboard itself never imports the engine; this test does, to pin the JSON shapes the Engine page relies on.
"""

from __future__ import annotations

# Plain imports, never `importorskip`: the engine is part of this repository and installed by `make install`, so a
# missing or moved module must fail this contract, not skip it (under CI a skip would hide the break).
import torch  # noqa: F401 - the engine's cache needs it; imported first so its absence reads as such

import local_engine.cache.radix_cache as radix
import local_engine.cache.slot_allocator as allocator_module
from dashboard.cache_tree import flatten_tree
from dashboard.engine_client import CacheStats, stats_from_payload


def test_real_radix_cache_views_are_understood() -> None:
    allocator = allocator_module.SlotAllocator(256)
    cache = radix.RadixCache(radix.RadixCacheConfig(), allocator)
    shared = list(range(100, 140))
    for namespace, tail in (("tenant-a", [1, 2, 3]), ("tenant-a", [4, 5]), ("tenant-b", [6])):
        tokens = shared + tail
        slots = allocator.alloc(len(tokens))
        result = cache.insert(namespace, tokens, slots)
        assert result is not None
    stats = stats_from_payload(cache.stats().as_dict())
    assert isinstance(stats, CacheStats)
    assert stats.capacity_tokens == 256
    assert stats.evictable_tokens + stats.protected_tokens <= stats.used_tokens <= 256
    flat, summaries = flatten_tree(cache.snapshot(max_nodes=100)["namespaces"])
    assert len(summaries) == 2
    assert sum(summary.num_tokens for summary in summaries) == stats.evictable_tokens + stats.protected_tokens
    assert flat.subtree_tokens[0] == sum(summary.num_tokens for summary in summaries)


# Every key of a tier in `/v1/cache` `tiers` (the tiers contract); the Engine page reads all of them.
TIER_KEYS = {
    "enabled", "capacity_tokens", "cached_tokens", "free_tokens", "evictable_tokens", "protected_tokens",
    "capacity_bytes", "hit_tokens_total", "loads_total", "load_tokens_total", "load_ms_total", "demoted_tokens_total",
    "dropped_tokens_total", "corrupt_files_total",
}


def _tiny_engine(kv_cache_tokens: int):  # type: ignore[no-untyped-def]
    """The real engine over a tiny random Llama and SmolLM2's tokenizer (local files only), not started."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from local_engine.config import EngineConfig
    from local_engine.engine.engine import Engine
    from local_engine.model.loader import smollm2_directory, wrap_model

    tokenizer = AutoTokenizer.from_pretrained(
        smollm2_directory(), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", local_files_only=True
    )
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, eos_token_id=2,
                         bos_token_id=1)
    loaded = wrap_model(LlamaForCausalLM(config).eval(), tokenizer, "tiny-llama")
    return Engine(EngineConfig(device="cpu", kv_cache_tokens=kv_cache_tokens), loaded)


def test_real_engine_cache_answer_has_the_tiers_the_page_reads() -> None:
    """`Engine.cache_stats()` is the body of `GET /v1/cache`: its `tiers` must parse, name the three tiers fastest
    first, and agree with the pool figures; a repeated prompt counts as hit tokens of the device tier.

    Fails until the engine reports tiers (the tiers-core change); it is not skipped, so the contract is checked."""
    import asyncio

    from local_engine.engine.types import GenerationRequest
    from local_engine.engine.sampling import SamplingParams

    engine = _tiny_engine(kv_cache_tokens=256)
    engine.start()
    try:
        prompt = tuple(range(100, 140))

        async def twice() -> int:
            for _ in range(2):
                handle = await engine.submit(GenerationRequest(prompt, SamplingParams(max_tokens=1, temperature=0.0)))
                report = handle.report.result()
                async for _event in handle.stream():
                    pass
            return report.matched_tokens

        matched = asyncio.run(twice())
        payload = engine.cache_stats()
    finally:
        engine.stop()
    assert matched > 0
    assert "tiers" in payload, "GET /v1/cache has no 'tiers' object (the engine predates the tiers contract)"
    for name, tier in payload["tiers"].items():
        assert TIER_KEYS <= set(tier), f"tier {name} lacks {sorted(TIER_KEYS - set(tier))}"
    stats = stats_from_payload(payload)
    assert stats.tiers is not None
    assert [tier.name for tier in stats.tiers] == ["device", "host", "disk"]
    device, host, disk = stats.tiers
    # Lower tiers are off unless configured (no --host-cache-tokens, no --disk-cache-dir).
    assert device.enabled and not host.enabled and not disk.enabled
    assert device.capacity_tokens == stats.capacity_tokens == 256
    assert device.cached_tokens == stats.evictable_tokens + stats.protected_tokens
    assert device.evictable_tokens + device.protected_tokens == device.cached_tokens
    assert device.cached_tokens + device.free_tokens <= device.capacity_tokens
    assert device.hit_tokens_total >= matched
    assert (host.cached_tokens, disk.cached_tokens, host.loads_total, disk.loads_total) == (0, 0, 0, 0)
