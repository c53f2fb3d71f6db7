"""The engine with a device pool of a few hundred tokens, a host tier and a disk tier, on the tiny random Llama:
answers never change (greedy, against a no-cache run), prefixes come back from host and disk, a restart serves
from disk, a corrupt file is skipped, and two engines never share a directory."""

from __future__ import annotations

import asyncio

import pytest

from local_engine.cache.tiers.disk_index import DiskCacheLocked
from local_engine.config import EngineConfig
from local_engine.engine.engine import Engine
from local_engine.engine.types import GenerationRequest
from local_engine.errors import InvalidRequest
from local_engine.engine.sampling import SamplingParams

from .conftest import run_to_end
from .test_engine import prompt

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPTS = [prompt(70 + i, 110) for i in range(4)]  # 4 x ~116 stored tokens > the 300-token device pool


@pytest.fixture(scope="module")
def expected(tiny_loaded):
    """Greedy answers without any cache."""
    engine = Engine(EngineConfig(prefix_cache=False, kv_cache_tokens=4096), tiny_loaded)
    engine.start()
    try:
        return [asyncio.run(run_to_end(engine, GenerationRequest(p, GREEDY)))[1] for p in PROMPTS]
    finally:
        engine.stop()


def serve_all(engine: Engine, prompts, retention=None):
    async def scenario():
        results = []
        for p in prompts:
            report, text, _ = await run_to_end(engine, GenerationRequest(p, GREEDY, retention=retention))
            engine.check_integrity()
            results.append((report, text))
        return results

    return asyncio.run(scenario())


@pytest.mark.parametrize(("policy", "page_size"), [("write_back", 1), ("write_through", 1), ("write_back", 16)])
def test_cycling_more_prefixes_than_the_device_holds_serves_them_from_host_and_disk(make_engine, tmp_path, expected,
                                                                                    policy, page_size):
    engine = make_engine(kv_cache_tokens=300, host_cache_tokens=240, disk_cache_dir=str(tmp_path / "kv"),
                         cache_write_policy=policy, page_size=page_size)
    first = serve_all(engine, PROMPTS)
    second = serve_all(engine, PROMPTS)
    assert [text for _, text in first] == expected
    assert [text for _, text in second] == expected
    matchable = 109 - 109 % page_size
    assert all(report.matched_tokens == matchable for report, _ in second)
    lower = [report.tiers for report, _ in second]
    assert sum(t.host for t in lower) > 0 and sum(t.disk for t in lower) > 0
    assert all(t.total == matchable for t in lower)
    tiers = engine.cache_stats()["tiers"]
    assert tiers["host"]["loads_total"] > 0 and tiers["disk"]["loads_total"] > 0
    assert tiers["host"]["hit_tokens_total"] == sum(t.host for t in lower)
    assert tiers["device"]["capacity_tokens"] == 300 and tiers["host"]["enabled"] and tiers["disk"]["enabled"]
    assert any(report.load_ms > 0 for report, _ in second)


def test_a_restart_serves_from_disk_and_a_corrupt_file_is_skipped(make_engine, tmp_path, expected):
    directory = str(tmp_path / "kv")
    engine = make_engine(kv_cache_tokens=300, host_cache_tokens=120, disk_cache_dir=directory)
    serve_all(engine, PROMPTS)
    engine.stop()  # writes what is not on disk yet

    restarted = make_engine(kv_cache_tokens=300, disk_cache_dir=directory)
    assert restarted.cache_stats()["tiers"]["disk"]["cached_tokens"] >= 4 * 109
    results = serve_all(restarted, PROMPTS[:2])
    assert [text for _, text in results] == expected[:2]
    assert all(report.tiers.disk == 109 for report, _ in results)
    restarted.stop()

    files = sorted((tmp_path / "kv").glob("*.kv"))
    for path in files:  # flip one payload byte in every file: nothing may be served from them
        data = bytearray(path.read_bytes())
        data[-7] ^= 0x40
        path.write_bytes(bytes(data))
    damaged = make_engine(kv_cache_tokens=300, disk_cache_dir=directory)
    results = serve_all(damaged, PROMPTS[2:])
    assert [text for _, text in results] == expected[2:]
    assert all(report.matched_tokens < 109 for report, _ in results)
    assert damaged.cache_stats()["tiers"]["disk"]["corrupt_files_total"] >= 2
    damaged.check_integrity()


def test_two_engines_never_share_a_disk_directory(make_engine, tiny_loaded, tmp_path):
    make_engine(kv_cache_tokens=300, disk_cache_dir=str(tmp_path))
    with pytest.raises(DiskCacheLocked, match=str(tmp_path)):
        Engine(EngineConfig(kv_cache_tokens=300, disk_cache_dir=str(tmp_path)), tiny_loaded)


def test_persistent_retention_outlives_pressure_and_an_unknown_class_is_refused(make_engine):
    engine = make_engine(kv_cache_tokens=300)
    serve_all(engine, PROMPTS[:1], retention="persistent")
    serve_all(engine, PROMPTS[1:3], retention="5m")
    report, _ = serve_all(engine, PROMPTS[:1])[0]
    assert report.matched_tokens == 109

    async def bad():
        await engine.submit(GenerationRequest(PROMPTS[0], GREEDY, retention="forever"))

    with pytest.raises(InvalidRequest) as error:
        asyncio.run(bad())
    assert error.value.param == "cache_retention"


def test_a_drain_writes_the_cache_to_disk_and_frees_the_directory(make_engine, tmp_path, expected):
    engine = make_engine(kv_cache_tokens=300, disk_cache_dir=str(tmp_path))
    serve_all(engine, PROMPTS[:2])  # both fit on the device: nothing was demoted to disk yet
    assert engine.cache_stats()["tiers"]["disk"]["cached_tokens"] == 0
    engine.begin_drain(0)  # what SIGTERM does
    assert engine.wait_drained(30)
    again = make_engine(kv_cache_tokens=300, disk_cache_dir=str(tmp_path))  # the directory's lock was released
    assert again.cache_stats()["tiers"]["disk"]["cached_tokens"] >= 2 * 109
    results = serve_all(again, PROMPTS[:2])
    assert [text for _, text in results] == expected[:2]
    assert all(report.tiers.disk == 109 for report, _ in results)


def test_an_unusable_disk_directory_or_host_size_is_a_clear_error(tiny_loaded, tmp_path):
    from local_engine.engine.kv_tiers import TierUnavailable

    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    for directory in (a_file, a_file / "below"):
        with pytest.raises(TierUnavailable, match=f"--disk-cache-dir {directory}"):
            Engine(EngineConfig(kv_cache_tokens=300, disk_cache_dir=str(directory)), tiny_loaded)
    with pytest.raises(TierUnavailable, match="--host-cache"):
        Engine(EngineConfig(kv_cache_tokens=300, host_cache_tokens=10**17), tiny_loaded)
