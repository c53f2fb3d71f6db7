"""Copies between KV pools: runs of consecutive slots (narrow + copy_) and scattered slots (gather/scatter) move the
same bytes."""

from __future__ import annotations

import torch

from local_engine.cache import KVPool
from local_engine.cache.kv_pool import KVPoolConfig
from local_engine.cache.slot_runs import slot_runs

CONFIG = KVPoolConfig(num_layers=3, num_kv_heads=2, head_dim=4, dtype=torch.float32, device=torch.device("cpu"))


def _random_pool(num_slots: int, seed: int) -> KVPool:
    pool = KVPool(CONFIG, num_slots)
    generator = torch.Generator().manual_seed(seed)
    pool.k.copy_(torch.randn(pool.k.shape, generator=generator))
    pool.v.copy_(torch.randn(pool.v.shape, generator=generator))
    return pool


def test_slot_runs_split_ascending_runs_and_give_up_on_scattered_slots():
    assert slot_runs(torch.tensor([], dtype=torch.int64)) == []
    assert slot_runs(torch.tensor([5, 6, 7, 2, 3, 9])) == [(0, 5, 3), (3, 2, 2), (5, 9, 1)]
    assert slot_runs(torch.tensor([4, 3, 2])) == [(0, 4, 1), (1, 3, 1), (2, 2, 1)]
    scattered = torch.randperm(200, generator=torch.Generator().manual_seed(0))
    assert slot_runs(scattered, max_runs=32) is None


def test_contiguous_runs_and_scattered_slots_copy_identical_kv():
    source = _random_pool(64, seed=1)
    slot_lists = {
        "one run": torch.arange(10, 30),
        "a few runs": torch.cat([torch.arange(40, 48), torch.arange(2, 8), torch.arange(20, 26)]),
        "scattered": torch.randperm(64, generator=torch.Generator().manual_seed(2))[:20],
    }
    expected_targets = {
        "one run": torch.arange(0, 20),
        "a few runs": torch.cat([torch.arange(30, 40), torch.arange(5, 15)]),
        "scattered": torch.randperm(48, generator=torch.Generator().manual_seed(3))[:20],
    }
    for name, slots in slot_lists.items():
        # Reference: a plain gather of the source rows.
        want_k, want_v = source.k[:, slots], source.v[:, slots]
        k, v = source.read_all_layers(slots)
        assert torch.equal(k, want_k) and torch.equal(v, want_v), name
        for target_slots in expected_targets.values():
            if target_slots.numel() != slots.numel():
                continue
            target = KVPool(CONFIG, 48)
            target.write_all_layers(target_slots, k, v)
            assert torch.equal(target.k[:, target_slots], want_k), name
            assert torch.equal(target.v[:, target_slots], want_v), name
            untouched = torch.ones(48, dtype=torch.bool)
            untouched[target_slots] = False
            assert target.k[:, untouched].eq(0).all() and target.v[:, untouched].eq(0).all(), name


def test_pool_to_pool_copies_match_a_gather_for_runs_and_scattered_slots():
    from local_engine.cache.kv_pool import copy_slots
    from local_engine.cache.slot_runs import joint_runs

    assert joint_runs([(0, 10, 4), (4, 50, 2)], [(0, 0, 3), (3, 20, 3)]) == [(10, 0, 3), (13, 20, 1), (50, 21, 2)]
    source = _random_pool(64, seed=4)
    cases = [
        (torch.arange(5, 25), torch.arange(28, 48)),
        (torch.cat([torch.arange(40, 50), torch.arange(0, 10)]), torch.cat([torch.arange(7, 12), torch.arange(20, 35)])),
        (torch.randperm(64, generator=torch.Generator().manual_seed(5))[:40], torch.arange(0, 40)),
        (torch.arange(0, 40), torch.randperm(48, generator=torch.Generator().manual_seed(6))[:40]),
    ]
    for source_slots, target_slots in cases:
        target = KVPool(CONFIG, 48)
        copy_slots(source, source_slots, target, target_slots)
        assert torch.equal(target.k[:, target_slots], source.k[:, source_slots])
        assert torch.equal(target.v[:, target_slots], source.v[:, source_slots])
        untouched = torch.ones(48, dtype=torch.bool)
        untouched[target_slots] = False
        assert target.k[:, untouched].eq(0).all()
