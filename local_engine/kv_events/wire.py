"""The KV-event wire format of vLLM and SGLang, as the engine publishes it.

Source of the format: vLLM's `vllm/distributed/kv_events.py` (`KVEventBatch`, `BlockStored`, `BlockRemoved`,
`AllBlocksCleared`, `ZmqEventPublisher`) and its `examples/online_serving/kv_events_subscriber.py`; SGLang's
`python/sglang/srt/disaggregation/kv_events.py` declares the same messages. One ZeroMQ message per batch, three
frames: `[topic, sequence (8-byte big-endian, from 0), payload]`; the payload is a msgpack `KVEventBatch`.

Every struct is array-like (a msgpack array, fields in declaration order) and the events are tagged with their class
name as the first element: `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
lora_name, extra_keys]`. Trailing fields left at their default are omitted, so a decoder written for the shorter,
older declarations (six fields of `BlockStored`) reads these batches too.

Namespaces ride as vLLM carries `cache_salt`: in `extra_keys` of the first block of a chain (`[(namespace,), None,
...]`, one entry per block); the block hashes already cover it, so a child block inherits its parent's namespace.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

# `medium` names the tier holding the block, in vLLM's offloading vocabulary (`GPULoadStoreSpec.medium()` "GPU",
# `CPULoadStoreSpec.medium()` "CPU"); "DISK" is the third tier's name in SGLang's hierarchical cache.
MEDIUM_DEVICE: Final = "GPU"  # the engine's KV pool on its device (HBM on a GPU; the device pool on a CPU engine)
MEDIUM_HOST: Final = "CPU"  # the host-memory pool (`--host-cache-tokens`)
MEDIUM_DISK: Final = "DISK"  # the disk tier (`--disk-cache-dir`)
MEDIUMS: Final = (MEDIUM_DEVICE, MEDIUM_HOST, MEDIUM_DISK)  # indexed by tier: device, host, disk

END_OF_REPLAY_SEQ: Final = (-1).to_bytes(8, "big", signed=True)  # the replay's last reply: [END, b""]


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the three event kinds (tagged by class name)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]  # len(block_hashes) * block_size tokens
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float  # seconds since the epoch when the batch was sent
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(8, "big")
