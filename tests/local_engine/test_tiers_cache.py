"""The tiered radix cache on small real pools: demotion, load-back, write-through, retention, corruption, restart."""

from __future__ import annotations

import os
import stat

import pytest

from local_engine.cache import MissKind
from local_engine.cache.tiers.disk_index import DiskCacheLocked, DiskTier
from local_engine.cache.tiers.disk_store import KVLayout
from local_engine.cache.tiers.persistence import persist_to_disk, rebuild_from_disk
from local_engine.cache.tiers import TierTokens

from .tier_fixtures import LAYOUT, FakeClock, admit, assert_kv, release, store, tiered_cache

A = list(range(100, 130))  # 30 tokens
B = list(range(200, 230))
C = list(range(300, 330))


def test_eviction_demotes_to_host_and_a_match_loads_it_back_unchanged():
    cache = tiered_cache(device_tokens=40, host_tokens=64)
    store(cache, "ns", A)
    store(cache, "ns", B)  # A leaves the device for the host
    cache.check_integrity()
    assert cache.match("ns", A + [1], dry_run=True).tier_tokens == TierTokens(device=0, host=30, disk=0)
    match, own = admit(cache, "ns", A + [1])
    assert match.matched_tokens == 30 and match.tier_tokens == TierTokens(0, 30, 0)
    assert_kv(cache.tiers.device_pool, match.slots, "ns", A)
    cache.check_integrity(num_slots_outside_tree=own.numel())
    release(cache, match, own)
    stats = cache.tier_stats()
    assert stats["host"]["loads_total"] == 1 and stats["host"]["load_tokens_total"] == 30
    assert stats["device"]["demoted_tokens_total"] >= 30
    # A is on the device again (the host copy stays); the next match is all device.
    assert cache.match("ns", A + [1], dry_run=True).tier_tokens.device == 30
    cache.check_integrity()


def test_without_a_host_tier_the_device_demotes_straight_to_disk(tmp_path):
    cache = tiered_cache(device_tokens=40, disk_dir=tmp_path / "kv", disk_tokens=200)
    store(cache, "ns", A)
    store(cache, "ns", B)
    assert cache.match("ns", A + [1], dry_run=True).tier_tokens == TierTokens(0, 0, 30)
    match, own = admit(cache, "ns", A + [1])
    assert match.tier_tokens == TierTokens(0, 0, 30)
    assert_kv(cache.tiers.device_pool, match.slots, "ns", A)
    release(cache, match, own)
    cache.check_integrity()
    assert stat.S_IMODE(os.stat(tmp_path / "kv").st_mode) == 0o700


def test_a_full_host_tier_demotes_to_disk_and_a_full_disk_drops_with_an_evicted_ghost(tmp_path):
    cache = tiered_cache(device_tokens=32, host_tokens=32, disk_dir=tmp_path, disk_tokens=32)
    for tokens in (A, B, C):
        store(cache, "ns", tokens)
        cache.check_integrity()
    # C on device, B on host, A on disk.
    assert cache.match("ns", A + [1], dry_run=True).tier_tokens.disk == 30
    assert cache.match("ns", B + [1], dry_run=True).tier_tokens.host == 30
    store(cache, "ns", list(range(400, 430)))  # A falls off the end
    cache.check_integrity()
    gone = cache.match("ns", A + [1])
    assert gone.matched_tokens == 0 and gone.miss_kind is MissKind.EVICTED
    assert cache.tier_stats()["disk"]["dropped_tokens_total"] == 30


def test_paths_keep_the_tier_order_and_a_match_spans_tiers(tmp_path):
    cache = tiered_cache(device_tokens=64, host_tokens=40, disk_dir=tmp_path, disk_tokens=100)
    store(cache, "ns", A)
    store(cache, "ns", A + B)  # one path of 60 tokens: 30 + 30
    store(cache, "ns", C)
    store(cache, "ns", list(range(500, 530)))
    cache.check_integrity()
    tiers = cache.match("ns", A + B + [1], dry_run=True).tier_tokens
    assert tiers.total == 60
    match, own = admit(cache, "ns", A + B + [1])
    assert match.matched_tokens == 60 and match.tier_tokens == tiers
    assert_kv(cache.tiers.device_pool, match.slots, "ns", A + B)
    release(cache, match, own)
    cache.check_integrity()


def test_write_through_copies_down_at_insert_and_eviction_only_frees(tmp_path):
    cache = tiered_cache(device_tokens=40, host_tokens=64, disk_dir=tmp_path, disk_tokens=100,
                         write_policy="write_through")
    store(cache, "ns", A)
    stats = cache.tier_stats()
    assert stats["host"]["cached_tokens"] == 30 and stats["disk"]["cached_tokens"] == 30
    assert len([name for name in os.listdir(tmp_path) if name.endswith(".kv")]) == 1
    store(cache, "ns", B)
    cache.check_integrity()
    assert cache.match("ns", A + [1], dry_run=True).tier_tokens == TierTokens(0, 30, 0)
    assert cache.tier_stats()["host"]["cached_tokens"] == 60


def test_persistent_prefixes_are_evicted_after_the_others():
    cache = tiered_cache(device_tokens=64)
    store(cache, "ns", A, retention="persistent")
    store(cache, "ns", B, retention="5m")
    store(cache, "ns", C)  # needs room: B goes though A is older
    assert cache.match("ns", A + [1], dry_run=True).matched_tokens == 30
    assert cache.match("ns", B + [1], dry_run=True).matched_tokens == 0
    cache.check_integrity()


def test_retention_classes_expire_in_every_tier_and_persistent_never(tmp_path):
    clock = FakeClock()
    cache = tiered_cache(device_tokens=32, host_tokens=32, disk_dir=tmp_path, disk_tokens=64, clock=clock)
    store(cache, "ns", A, retention="5m")
    store(cache, "ns", B, retention="persistent")
    store(cache, "ns", C, retention="1h")  # A on disk, B on host, C on device
    clock.now += 301
    cache.expire()
    cache.check_integrity()
    assert cache.match("ns", A + [1], dry_run=True).matched_tokens == 0
    assert cache.match("ns", C + [1], dry_run=True).matched_tokens == 30
    clock.now += 3600
    expired = cache.match("ns", C + [1])
    assert expired.matched_tokens == 0 and expired.miss_kind is MissKind.EXPIRED
    assert cache.match("ns", B + [1], dry_run=True).matched_tokens == 30
    cache.check_integrity()
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".kv")]


def test_the_longest_class_that_used_a_prefix_wins():
    clock = FakeClock()
    cache = tiered_cache(device_tokens=64, clock=clock)
    store(cache, "ns", A, retention="5m")
    match, own = admit(cache, "ns", A + [1], retention="1h")
    release(cache, match, own)
    clock.now += 600
    assert cache.match("ns", A + [1]).matched_tokens == 30


def test_a_corrupt_disk_file_is_never_served_and_cuts_the_match(tmp_path):
    cache = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=200)
    store(cache, "ns", A)
    store(cache, "ns", A + B)
    store(cache, "ns", list(range(500, 560)))  # A and A+B go to disk, as two files
    files = sorted(tmp_path.glob("*.kv"), key=lambda p: p.stat().st_size)
    assert len(files) == 2
    lower = max(files, key=lambda p: len(open(p, "rb").read(4096)))  # both same size; pick the B file by header
    for path in files:
        if b'"edge_start":30' in path.read_bytes()[:4096]:
            lower = path
    data = bytearray(lower.read_bytes())
    data[-3] ^= 0xFF
    lower.write_bytes(bytes(data))
    match, own = admit(cache, "ns", A + B + [1])
    assert match.matched_tokens == 30 and match.tier_tokens == TierTokens(0, 0, 30)
    assert_kv(cache.tiers.device_pool, match.slots, "ns", A)
    cache.check_integrity(num_slots_outside_tree=own.numel())
    release(cache, match, own)
    assert not lower.exists()
    assert cache.tier_stats()["disk"]["corrupt_files_total"] == 1
    assert cache.match("ns", A + B + [1], dry_run=True).matched_tokens == 30
    cache.check_integrity()


def test_a_restart_rebuilds_disk_nodes_from_headers_and_serves_them(tmp_path):
    clock = FakeClock()
    cache = tiered_cache(device_tokens=64, host_tokens=32, disk_dir=tmp_path, disk_tokens=300, clock=clock)
    store(cache, "ns", A, retention="persistent")
    store(cache, "ns", A + B)
    store(cache, "other", C)
    persist_to_disk(cache)
    assert cache.tier_stats()["disk"]["cached_tokens"] == 90  # everything, whichever tier it was in
    cache.tiers.disk.close()
    again = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300)
    assert rebuild_from_disk(again) == 3
    again.check_integrity()
    assert again.match("ns", A + B + [1], dry_run=True).tier_tokens == TierTokens(0, 0, 60)
    match, own = admit(again, "ns", A + [7])  # splits nothing: A is its own file
    assert_kv(again.tiers.device_pool, match.slots, "ns", A)
    release(again, match, own)
    match, own = admit(again, "ns", A + B[:10] + [7])  # ends inside B's file: a split extent
    assert match.matched_tokens == 40
    assert_kv(again.tiers.device_pool, match.slots, "ns", A + B[:10])
    release(again, match, own)
    again.check_integrity()
    assert again.match("other", C + [1], dry_run=True).matched_tokens == 30


def test_rebuild_skips_corrupt_truncated_and_foreign_files(tmp_path):
    cache = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300)
    store(cache, "ns", A)
    store(cache, "ns", B)
    store(cache, "ns", C)
    persist_to_disk(cache)
    cache.tiers.disk.close()
    paths = sorted(tmp_path.glob("*.kv"))
    assert len(paths) == 3
    paths[0].write_bytes(paths[0].read_bytes()[:-5])  # truncated
    raw = bytearray(paths[1].read_bytes())
    raw[10:14] = b"\xff\xfe\xfd\xfc"  # header no longer JSON
    paths[1].write_bytes(bytes(raw))
    (tmp_path / "junk.kv").write_bytes(b"hello")
    again = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300)
    assert rebuild_from_disk(again) == 1
    assert again.tier_stats()["disk"]["corrupt_files_total"] == 3
    again.check_integrity()
    again.tiers.disk.close()
    foreign = KVLayout("another-model", LAYOUT.dtype, 1, 2, 1, 2)
    third = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300, layout=foreign)
    assert rebuild_from_disk(third) == 0
    assert third.tier_stats()["disk"]["corrupt_files_total"] == 4


def test_a_second_engine_on_the_same_directory_is_refused(tmp_path):
    first = DiskTier(str(tmp_path), LAYOUT, 1 << 20)
    first.open()
    with pytest.raises(DiskCacheLocked, match=str(tmp_path)):
        DiskTier(str(tmp_path), LAYOUT, 1 << 20).open()
    first.close()
    DiskTier(str(tmp_path), LAYOUT, 1 << 20).open()


def test_tier_stats_have_the_contract_keys(tmp_path):
    cache = tiered_cache(device_tokens=32, host_tokens=16, disk_dir=tmp_path, disk_tokens=10)
    stats = cache.tier_stats()
    assert list(stats) == ["device", "host", "disk"]
    keys = {"enabled", "capacity_tokens", "cached_tokens", "free_tokens", "evictable_tokens", "protected_tokens",
            "capacity_bytes", "hit_tokens_total", "loads_total", "load_tokens_total", "load_ms_total",
            "demoted_tokens_total", "dropped_tokens_total", "corrupt_files_total"}
    assert all(set(tier) == keys for tier in stats.values())
    assert stats["host"]["capacity_tokens"] == 16 and stats["disk"]["capacity_tokens"] == 10
    assert stats["disk"]["capacity_bytes"] == 10 * LAYOUT.payload_bytes(1)


def test_after_a_restart_idle_time_counts_from_the_file_mtime(tmp_path):
    cache = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300)
    store(cache, "ns", A, retention="5m")
    store(cache, "ns", B, retention="persistent")
    persist_to_disk(cache)
    cache.tiers.disk.close()
    long_ago = os.path.getmtime(next(tmp_path.glob("*.kv"))) - 600
    for path in tmp_path.glob("*.kv"):
        os.utime(path, (long_ago, long_ago))
    again = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300)
    assert rebuild_from_disk(again) == 2
    expired = again.match("ns", A + [1])
    assert expired.matched_tokens == 0 and expired.miss_kind is MissKind.EXPIRED
    assert again.match("ns", B + [1], dry_run=True).matched_tokens == 30
    again.check_integrity()


def _rewrite_header(path, edit) -> None:
    """Apply `edit` to the JSON header of the KV file at `path`, keeping its payload (and checksum) as they are."""
    import json

    from local_engine.cache.tiers.disk_store import _PREFIX, MAGIC

    raw = path.read_bytes()
    _, length = _PREFIX.unpack(raw[: _PREFIX.size])
    header = json.loads(raw[_PREFIX.size : _PREFIX.size + length])
    edit(header)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    path.write_bytes(_PREFIX.pack(MAGIC, len(encoded)) + encoded + raw[_PREFIX.size + length :])


def test_a_file_whose_header_names_other_tokens_is_never_served(tmp_path):
    # The checksum covers the payload only: a damaged token id (or namespace) in the header would index the KV of
    # one path under another, and serve it for a prompt it was never computed for.
    cache = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300)
    store(cache, "ns", A)
    persist_to_disk(cache)
    cache.tiers.disk.close()
    [path] = tmp_path.glob("*.kv")
    _rewrite_header(path, lambda header: header["token_ids"].__setitem__(5, 999))
    again = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300)
    assert rebuild_from_disk(again) == 0
    assert again.tier_stats()["disk"]["corrupt_files_total"] == 1
    tampered = A[:5] + [999] + A[6:]
    assert again.match("ns", tampered + [1], dry_run=True).matched_tokens == 0
    again.check_integrity()
    again.tiers.disk.close()
    _rewrite_header(path, lambda header: header.update(namespace="elsewhere"))
    third = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300)
    assert rebuild_from_disk(third) == 0
    assert third.match("elsewhere", A + [1], dry_run=True).matched_tokens == 0


def test_a_header_that_spells_its_numbers_as_strings_does_not_stop_the_rebuild(tmp_path):
    cache = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300)
    store(cache, "ns", A)
    persist_to_disk(cache)
    cache.tiers.disk.close()
    [path] = tmp_path.glob("*.kv")
    _rewrite_header(path, lambda header: header.update(edge_start=str(header["edge_start"]),
                                                       num_tokens=str(header["num_tokens"])))
    again = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300)
    assert rebuild_from_disk(again) == 1
    match, own = admit(again, "ns", A + [7])
    assert_kv(again.tiers.device_pool, match.slots, "ns", A)
    release(again, match, own)
    again.check_integrity()


def test_an_existing_directory_keeps_its_mode_and_other_programs_files(tmp_path):
    # `--disk-cache-dir` may name a directory that is not the engine's own (a shared cache root, /tmp): opening it
    # must not narrow its permissions for everyone else, nor delete temporaries the engine did not write.
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / ".tmp-editor-swap").write_text("someone else's")
    (shared / ".tmp-abc123.kv").write_bytes(b"a torn write of ours")
    cache = tiered_cache(device_tokens=64, disk_dir=shared, disk_tokens=300)
    rebuild_from_disk(cache)
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    assert (shared / ".tmp-editor-swap").read_text() == "someone else's"
    assert not (shared / ".tmp-abc123.kv").exists()
    cache.tiers.disk.close()


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_a_longer_class_given_after_the_disk_write_survives_a_restart(tmp_path, write_policy):
    # The file is written with the class of its time (at insert, or when demoted); a later request that asks for a
    # longer class must not be forgotten at the restart ("the longest class that stored or used a prefix wins").
    cache = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300, write_policy=write_policy)
    store(cache, "ns", A, retention="5m")
    if write_policy == "write_back":
        store(cache, "ns", B)
        store(cache, "ns", C)  # A is demoted to disk (with its 5m class), then loaded back by the match below
    match, own = admit(cache, "ns", A + [1], retention="persistent")
    release(cache, match, own)
    persist_to_disk(cache)
    cache.tiers.disk.close()
    long_ago = os.path.getmtime(next(tmp_path.glob("*.kv"))) - 7200
    for path in tmp_path.glob("*.kv"):
        os.utime(path, (long_ago, long_ago))
    again = tiered_cache(device_tokens=64, disk_dir=tmp_path, disk_tokens=300)
    rebuild_from_disk(again)
    assert again.match("ns", A + [1]).matched_tokens == 30
    again.check_integrity()
