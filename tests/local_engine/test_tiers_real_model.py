"""The tiered KV cache end to end: SmolLM2 served over real HTTP, called with the official `openai` package.

- a device pool too small for the working set, with a host tier: prefixes pushed out of the device come back from
  the host, answered exactly as before;
- a restart on the same `--disk-cache-dir` serves a repeat from disk, answered exactly as before; a page file
  damaged while the engine is stopped is skipped and the request is still answered exactly as before;
- retention classes: after the same idle time a "5m" prefix has expired and a "persistent" one is still served (the
  cache's clock is a fake one, moved by the test instead of sleeping).
"""

from __future__ import annotations

import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from local_engine.bench.engine import system_prompt
from local_engine.cache.tiers.disk_store import FILE_SUFFIX
from local_engine.cache.tiers import HEADER_TIERS, TierTokens

from .server_fixtures import served_engine

pytestmark = pytest.mark.real_model

MAX_TOKENS = 8


def client_for(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url + "/v1", api_key="not-needed", max_retries=0, timeout=300)


def messages(system: str, question: str = "Which rule applies to a late refund? Answer briefly.") -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def ask(client: OpenAI, chat: list[dict], **extra_body):
    """(answer text, usage, prefix_cache object, tiers from the header) of one greedy chat completion."""
    raw = client.chat.completions.with_raw_response.create(
        model="smollm2", messages=chat, max_tokens=MAX_TOKENS, temperature=0, extra_body=extra_body or None
    )
    completion = raw.parse()
    header = TierTokens.parse_header(raw.headers[HEADER_TIERS])
    return completion.choices[0].message.content, completion.usage, completion.prefix_cache, header


def tier_stats(base_url: str) -> dict:
    import httpx

    return httpx.get(base_url + "/v1/cache", timeout=30).json()["tiers"]


def metric(base_url: str, name: str, labels: dict | None = None) -> float:
    import httpx

    text = httpx.get(base_url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == (labels or {}):
                return sample.value
    raise AssertionError(f"{name} {labels} is not in /metrics")


def test_prefixes_pushed_out_of_the_device_pool_come_back_from_the_host_tier(smollm2_loaded):
    tokenizer = smollm2_loaded.tokenizer
    # Six ~1.5k-token prefixes cycled through a 4k-token device pool: by the time a prefix comes round again, the
    # four served after it have pushed it out to the 16k-token host tier.
    chats = [messages(system_prompt(tokenizer, 300 + i, 1500, seed=1)) for i in range(6)]
    with served_engine(smollm2_loaded, kv_cache_tokens=4096, host_cache_tokens=16384) as (base_url, _):
        client = client_for(base_url)
        first_round = [ask(client, chat) for chat in chats]
        assert all(usage.prompt_tokens_details.cached_tokens < 100 for _, usage, _, _ in first_round)
        for chat, (first_answer, _, _, _) in zip(chats, first_round):
            answer, usage, prefix_cache, header = ask(client, chat)
            cached = usage.prompt_tokens_details.cached_tokens
            assert cached >= 0.9 * usage.prompt_tokens
            tiers = prefix_cache["tiers"]
            assert tiers["host"] > 0 and sum(tiers.values()) == cached
            assert header == TierTokens(**tiers)
            assert prefix_cache["load_ms"] > 0
            assert answer == first_answer  # KV that went to host memory and back gives the same greedy answer
        # A streamed repeat says the same in its closing usage chunk.
        stream = client.chat.completions.create(
            model="smollm2", messages=chats[0], max_tokens=MAX_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
        usage_chunk = [chunk for chunk in stream if chunk.usage is not None][-1]
        assert sum(usage_chunk.prefix_cache["tiers"].values()) == usage_chunk.usage.prompt_tokens_details.cached_tokens
        assert usage_chunk.usage.prompt_tokens_details.cached_tokens >= 0.9 * usage_chunk.usage.prompt_tokens
        stats = tier_stats(base_url)
        assert stats["host"]["enabled"] and stats["host"]["capacity_tokens"] == 16384
        assert stats["host"]["hit_tokens_total"] > 0 and stats["host"]["loads_total"] >= 6
        assert stats["device"]["demoted_tokens_total"] > 0
        assert metric(base_url, "prefixscope_engine_tier_loads_total", {"tier": "host"}) == stats["host"]["loads_total"]
        assert metric(base_url, "prefixscope_engine_tier_cached_tokens", {"tier": "host"}) > 0


def _damage_largest_file(directory) -> None:
    """Flip bytes in the payload (the end) of the largest KV file, as a bad disk or a torn copy would."""
    largest = max(directory.glob(f"*{FILE_SUFFIX}"), key=lambda path: path.stat().st_size)
    data = bytearray(largest.read_bytes())
    for offset in range(len(data) - 4096, len(data), 64):
        data[offset] ^= 0xFF
    largest.write_bytes(bytes(data))


def test_a_restart_serves_from_disk_and_skips_a_damaged_file(smollm2_loaded, tmp_path):
    disk_dir = tmp_path / "kv"
    options = {"kv_cache_tokens": 4096, "disk_cache_dir": str(disk_dir)}
    chat = messages(system_prompt(smollm2_loaded.tokenizer, 400, 1200, seed=2))
    with served_engine(smollm2_loaded, **options) as (base_url, _):
        first_answer, first_usage, _, _ = ask(client_for(base_url), chat)
    assert first_usage.prompt_tokens_details.cached_tokens < 100
    assert list(disk_dir.glob(f"*{FILE_SUFFIX}"))  # stopping wrote the cache to disk

    with served_engine(smollm2_loaded, **options) as (base_url, _):  # a restart
        answer, usage, prefix_cache, header = ask(client_for(base_url), chat)
        assert answer == first_answer
        assert header.disk == prefix_cache["tiers"]["disk"] >= 0.95 * (usage.prompt_tokens - 1)
        assert usage.prompt_tokens_details.cached_tokens == header.total
        assert tier_stats(base_url)["disk"]["loads_total"] >= 1

    _damage_largest_file(disk_dir)
    with served_engine(smollm2_loaded, **options) as (base_url, _):
        answer, usage, prefix_cache, header = ask(client_for(base_url), chat)
        assert answer == first_answer  # the damaged KV was not served: the prefix was computed again
        assert header.total == usage.prompt_tokens_details.cached_tokens
        stats = tier_stats(base_url)
        assert stats["disk"]["corrupt_files_total"] >= 1
        assert metric(base_url, "prefixscope_engine_disk_corrupt_files_total") == stats["disk"]["corrupt_files_total"]


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1_000.0

    def __call__(self) -> float:
        return self.now_s


def test_a_5m_prefix_expires_while_a_persistent_one_survives_the_same_wait(smollm2_loaded):
    tokenizer = smollm2_loaded.tokenizer
    # Different from their first word on, so that only the chat template's opening is shared.
    short = messages("Refunds desk. " + system_prompt(tokenizer, 500, 300, seed=3))
    lasting = messages("Shipping desk. " + system_prompt(tokenizer, 501, 300, seed=3))
    clock = FakeClock()
    with served_engine(smollm2_loaded, kv_cache_tokens=4096, host_cache_tokens=4096) as (base_url, engine):
        # The cache takes its clock at construction; nothing is stored yet, so swapping it now is the same as
        # having built it with this one.
        engine.cache._clock = clock
        client = client_for(base_url)
        short_answer, _, _, _ = ask(client, short, cache_retention="5m")
        lasting_answer, _, _, _ = ask(client, lasting, cache_retention="persistent")
        clock.now_s += 2 * 3600  # two idle hours: past "5m" (and "1h"), nothing to "persistent"

        answer, usage, prefix_cache, _ = ask(client, lasting, cache_retention="persistent")
        assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1 and prefix_cache["miss"] == "hit"
        assert answer == lasting_answer
        answer, usage, prefix_cache, _ = ask(client, short, cache_retention="5m")
        # Only the chat template's opening, shared with the persistent prompt, is still there.
        assert usage.prompt_tokens_details.cached_tokens <= prefix_cache["template_tokens"]
        assert prefix_cache["miss"] in ("expired", "cold")
        assert answer == short_answer
        assert tier_stats(base_url)["device"]["dropped_tokens_total"] > 0
