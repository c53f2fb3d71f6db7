"""Reading the KV events vLLM, SGLang and prefixscope's engine publish, into the few facts a router needs.

Source of the format: vLLM's `vllm/distributed/kv_events.py` and `examples/online_serving/kv_events_subscriber.py`,
SGLang's `python/sglang/srt/disaggregation/kv_events.py`. A message is `[topic, seq (8-byte big-endian), payload]`;
the payload is a msgpack `KVEventBatch` `[ts, events, data_parallel_rank?]`. Releases differ in how an event is laid
out, so each is read by shape rather than by one declaration:

- array-like (vLLM up to its map encoding, SGLang, prefixscope): `["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium?, lora_name?, extra_keys?]`, `["BlockRemoved", block_hashes, medium?]`,
  `["AllBlocksCleared"]`;
- tagged maps (later vLLM): `{"type": "BlockStored", "block_hashes": ..., ...}` with the same field names, SGLang's
  `cache_salt` among them.

Block hashes are ints or bytes (vLLM's raw digests); they are only names here. A chain's namespace (the cache salt)
is the `cache_salt` field when present, else the salt vLLM puts in the first block's `extra_keys` (its last string
that is not the LoRA name); a child block inherits its parent's. `medium` maps to a tier: `GPU` (or none) the device
pool, `CPU`/`CPU_PINNED` host memory, `DISK`/`STORAGE`/`LOCAL_DISK` disk; other media are not indexed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

DEVICE, HOST, DISK = 0, 1, 2
TIER_NAMES = ("device", "host", "disk")
_MEDIUM_TIERS = {None: DEVICE, "GPU": DEVICE, "CPU": HOST, "CPU_PINNED": HOST, "DISK": DISK, "STORAGE": DISK,
                 "LOCAL_DISK": DISK}
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                  "extra_keys")
_REMOVED_FIELDS = ("block_hashes", "medium")
_DECODER = msgspec.msgpack.Decoder()


class MalformedEvents(ValueError):
    """A payload that is not a KV-event batch."""


@dataclass(frozen=True, slots=True)
class Stored:
    block_hashes: tuple[Any, ...]
    parent_hash: Any
    token_ids: list[int]
    block_size: int
    tier: int | None  # None: a medium this router does not index
    namespace: str | None  # None: inherited from the parent block


@dataclass(frozen=True, slots=True)
class Removed:
    block_hashes: tuple[Any, ...]
    tier: int | None


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


def decode_batch(payload: bytes) -> list[Event]:
    """The events of one payload, in order; events of unknown kinds are skipped. Raises `MalformedEvents`."""
    try:
        batch = _DECODER.decode(payload)
    except msgspec.DecodeError as error:
        raise MalformedEvents(f"not msgpack: {error}") from None
    if isinstance(batch, dict):
        events = batch.get("events")
    elif isinstance(batch, list) and len(batch) >= 2:
        events = batch[1]
    else:
        raise MalformedEvents("a KV event batch is [ts, events, ...]")
    if not isinstance(events, list):
        raise MalformedEvents("a KV event batch's events must be a list")
    decoded = []
    for raw in events:
        event = _event(raw)
        if event is not None:
            decoded.append(event)
    return decoded


def _fields(raw: Any, names: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        return raw[0], dict(zip(names, raw[1:]))
    if isinstance(raw, dict) and isinstance(raw.get("type"), str):
        return raw["type"], raw
    raise MalformedEvents("an event is a tagged array or a map with a 'type'")


def _event(raw: Any) -> Event | None:
    kind = raw[0] if isinstance(raw, list) and raw else raw.get("type") if isinstance(raw, dict) else None
    if kind == "BlockStored":
        _, fields = _fields(raw, _STORED_FIELDS)
        hashes, tokens, size = fields.get("block_hashes"), fields.get("token_ids"), fields.get("block_size")
        if not isinstance(hashes, list) or not isinstance(tokens, list) or not isinstance(size, int):
            raise MalformedEvents("BlockStored needs block_hashes, token_ids and block_size")
        if size < 1 or len(tokens) != len(hashes) * size or not all(isinstance(t, int) for t in tokens):
            return None  # placeholders (offloaded chunks without tokens) and unaligned blocks name nothing routable
        return Stored(tuple(hashes), fields.get("parent_block_hash"), tokens, size, _tier(fields.get("medium")),
                      _namespace(fields))
    if kind == "BlockRemoved":
        _, fields = _fields(raw, _REMOVED_FIELDS)
        hashes = fields.get("block_hashes")
        if not isinstance(hashes, list):
            raise MalformedEvents("BlockRemoved needs block_hashes")
        return Removed(tuple(hashes), _tier(fields.get("medium")))
    if kind == "AllBlocksCleared":
        return Cleared()
    if kind is None:
        raise MalformedEvents("an event is a tagged array or a map with a 'type'")
    return None


def _tier(medium: Any) -> int | None:
    return _MEDIUM_TIERS.get(medium.upper() if isinstance(medium, str) else medium)


def _namespace(fields: dict[str, Any]) -> str | None:
    salt = fields.get("cache_salt")
    if isinstance(salt, str):
        return salt
    if fields.get("parent_block_hash") is not None:
        return None
    extra = fields.get("extra_keys")
    first = extra[0] if isinstance(extra, list) and extra else None
    if isinstance(first, (list, tuple)):
        lora = fields.get("lora_name")
        strings = [item for item in first if isinstance(item, str) and item != lora]
        if strings:
            return strings[-1]
    return ""
