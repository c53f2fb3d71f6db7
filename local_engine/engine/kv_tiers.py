"""Builds the engine's KV tiers from EngineConfig: the device pool with its allocator, the L2 host pool and the L3
disk directory.

The disk tier only serves files written by the same model (the fingerprint), dtype, page size and KV shape; the
fingerprint hashes the model id, its config and a sample of its weights, so two random models of the same shape
differ too.
"""

from __future__ import annotations

import hashlib
import json

import torch

from local_engine.cache.tiers.disk_index import DiskTier, reserve_directory
from local_engine.cache.tiers.disk_store import KVLayout
from local_engine.cache.kv_pool import KVPool, KVPoolConfig
from local_engine.cache.slot_allocator import SlotAllocator
from local_engine.cache.tiers.store import TierStore
from local_engine.config import DEFAULT_KV_CACHE_TOKENS, EngineConfig


class TierUnavailable(RuntimeError):
    """A configured lower tier cannot be set up: the host pool cannot be allocated, or the disk directory cannot be
    created, locked or written. The message names the flag to change."""


def model_fingerprint(model: torch.nn.Module, model_id: str) -> str:
    """A short hex digest of the model's identity: id, config and the first and last values of its weights."""
    digest = hashlib.blake2b(model_id.encode(), digest_size=16)
    config = getattr(model, "config", None)
    if config is not None:
        text = json.dumps(config.to_dict(), sort_keys=True, default=str)
        digest.update(text.encode())
    with torch.no_grad():
        parameters = list(model.parameters())
        for parameter in parameters[:2] + parameters[-2:]:
            sample = parameter.detach().reshape(-1)[:4096].to("cpu", torch.float32)
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()


def build_device_pool(config: EngineConfig, pool_config: KVPoolConfig) -> tuple[KVPool, SlotAllocator]:
    """The device pool and its allocator, sized by `--kv-cache-tokens` or `--kv-cache-gib`. The pool holds one slot
    more than the allocator hands out, its last: the scratch slot of captured decode steps (their padding rows write
    it; local_engine.model.decode_graphs)."""
    if config.kv_cache_gib is not None:
        num_slots = pool_config.num_slots_for_gib(config.kv_cache_gib)
    else:
        num_slots = config.kv_cache_tokens or DEFAULT_KV_CACHE_TOKENS
    return KVPool(pool_config, num_slots + 1), SlotAllocator(num_slots)


def build_tier_store(
    config: EngineConfig,
    pool: KVPool,
    allocator: SlotAllocator,
    model: torch.nn.Module,
    model_id: str,
) -> TierStore:
    """The TierStore for `config`; opens (and locks) the disk directory when one is configured. Raises
    DiskCacheLocked when another engine holds that directory, TierUnavailable when a tier cannot be set up."""
    pool_config = pool.config
    host_pool = host_allocator = disk = None
    if config.host_enabled:
        host_config = KVPoolConfig(
            pool_config.num_layers, pool_config.num_kv_heads, pool_config.head_dim, pool_config.dtype,
            torch.device("cpu"),
        )
        if config.host_cache_gib:
            num_slots = host_config.num_slots_for_gib(config.host_cache_gib)
        else:
            num_slots = config.host_cache_tokens
        pin = pool_config.device.type == "cuda"
        try:
            host_pool = KVPool(host_config, num_slots, pin_memory=pin)
        except (RuntimeError, MemoryError) as error:
            raise TierUnavailable(
                f"cannot allocate the host cache tier ({num_slots} tokens, "
                f"{num_slots * host_config.bytes_per_token / 2**30:.2f} GiB): lower --host-cache-tokens / "
                f"--host-cache-gib ({str(error).splitlines()[0]})"
            ) from None
        host_allocator = SlotAllocator(num_slots)
    if config.disk_cache_dir is not None:
        layout = KVLayout(
            model_fingerprint(model, model_id), pool_config.dtype, config.page_size, pool_config.num_layers,
            pool_config.num_kv_heads, pool_config.head_dim,
        )
        disk = DiskTier(config.disk_cache_dir, layout, int(config.disk_capacity_gib * (1 << 30)))
        try:
            disk.open()
        except OSError as error:
            raise _unusable_directory(config.disk_cache_dir, error) from None
    return TierStore(
        device_pool=pool,
        device_allocator=allocator,
        host_pool=host_pool,
        host_allocator=host_allocator,
        disk=disk,
        write_policy=config.cache_write_policy,
    )


def reserve_disk_directory(directory: str) -> None:
    """Create and lock `--disk-cache-dir` before the model loads (see disk_index.reserve_directory). Raises
    DiskCacheLocked when another engine holds it, TierUnavailable when it cannot be used."""
    try:
        reserve_directory(directory)
    except OSError as error:
        raise _unusable_directory(directory, error) from None


def _unusable_directory(directory: str, error: OSError) -> TierUnavailable:
    return TierUnavailable(
        f"cannot use --disk-cache-dir {directory}: {error.strerror or error}"
        + (f" ({error.filename})" if error.filename and error.filename != directory else "")
    )


def tiers_summary(tiers: TierStore) -> str:
    """For the start-up line: ", host tier N tokens, disk tier DIR (G GiB), write_back"; empty without tiers."""
    parts = []
    if tiers.host_allocator is not None:
        parts.append(f"host tier {tiers.host_allocator.num_slots} tokens ({tiers.host_pool.num_bytes / 2**30:.2f} GiB)")
    if tiers.disk is not None:
        parts.append(f"disk tier {tiers.disk.directory} ({tiers.disk.capacity_bytes / 2**30:.2f} GiB, "
                     f"{tiers.disk.used_tokens} tokens indexed)")
    if parts:
        parts.append(tiers.write_policy)
    return "".join(", " + part for part in parts)
