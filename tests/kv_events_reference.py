"""A KV-event subscriber and publisher written only from vLLM's public definitions, for tests.

Sources: vLLM's `vllm/distributed/kv_events.py` (the `KVEventBatch`, `BlockStored`, `BlockRemoved` and
`AllBlocksCleared` msgspec structs, array-like and tagged; `ZmqEventPublisher`: PUB frames `[topic, seq (8-byte
big-endian, from 0), payload]`, a ROUTER replay socket answering a start sequence number with `[seq, payload]` frames
and an `[-1, b""]` end marker) and `examples/online_serving/kv_events_subscriber.py` (the SUB + REQ subscriber with
its gap replay). Nothing here imports prefixscope's engine or gateway: these are the other side of the wire.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import zmq
from msgspec.msgpack import Decoder, Encoder


# Types as vLLM declares them (examples/online_serving/kv_events_subscriber.py, vllm/distributed/kv_events.py).
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


END_SEQ = (-1).to_bytes(8, "big", signed=True)


class ReferenceSubscriber:
    """vLLM's example subscriber as a class: SUB on `endpoint`, a replay socket on `replay_endpoint`, gaps replayed.

    The example asks for replays on a REQ socket, which takes one reply per request and drops the rest; a DEALER
    socket sending the same `[b"", start]` envelope reads every batch the ROUTER sends back."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "") -> None:
        self.decoder = Decoder(type=KVEventBatch)
        self.context = zmq.Context()
        self.sub = self.context.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        self.replay = None
        if replay_endpoint is not None:
            self.replay = self.context.socket(zmq.DEALER)
            self.replay.connect(replay_endpoint)
        self.last_seq = -1
        self.batches: list[tuple[int, KVEventBatch]] = []
        self.missed = 0

    def replay_from(self, start: int, timeout_ms: int = 2000) -> int:
        """Ask for every retained batch from `start`; returns how many came."""
        assert self.replay is not None
        self.replay.send_multipart((b"", start.to_bytes(8, "big")))
        count = 0
        while self.replay.poll(timeout_ms):
            _, seq_bytes, payload = self.replay.recv_multipart()
            if not payload:
                break  # the end marker
            seq = int.from_bytes(seq_bytes, "big")
            if seq > self.last_seq:
                self.batches.append((seq, self.decoder.decode(payload)))
                self.last_seq = seq
                count += 1
        return count

    def poll(self, timeout_ms: int = 200) -> bool:
        if not self.sub.poll(timeout_ms):
            return False
        _, seq_bytes, payload = self.sub.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big")
        if seq <= self.last_seq:
            return True  # replayed already
        if self.last_seq >= 0 and seq > self.last_seq + 1:
            self.missed += seq - self.last_seq - 1
            if self.replay is not None:
                self.replay_from(self.last_seq + 1)
        if seq > self.last_seq:
            self.batches.append((seq, self.decoder.decode(payload)))
            self.last_seq = seq
        return True

    def drain(self, quiet_ms: int = 300) -> None:
        while self.poll(quiet_ms):
            pass

    def close(self) -> None:
        self.sub.close(0)
        if self.replay is not None:
            self.replay.close(0)
        self.context.term()


class ReferencePublisher:
    """vLLM's `ZmqEventPublisher` reduced to its wire behaviour, driven by hand: PUB + ROUTER replay."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:*", replay_endpoint: str = "tcp://127.0.0.1:*",
                 topic: str = "") -> None:
        self.context = zmq.Context()
        self.pub = self.context.socket(zmq.PUB)
        self.pub.bind(endpoint)
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = self.context.socket(zmq.ROUTER)
        self.router.bind(replay_endpoint)
        self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.topic = topic.encode()
        self.encoder = Encoder()
        self.buffer: list[tuple[int, bytes]] = []
        self.next_seq = 0

    def publish(self, events: list[KVCacheEvent], *, send: bool = True) -> int:
        """Number and retain one batch; `send=False` keeps it from the PUB socket (a lost message, for gap tests)."""
        seq = self.next_seq
        self.next_seq += 1
        payload = self.encoder.encode(KVEventBatch(ts=time.time(), events=events))
        self.buffer.append((seq, payload))
        if send:
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        return seq

    def serve_replays(self, timeout_ms: int = 0) -> int:
        """Answer the waiting replay requests; returns how many."""
        served = 0
        while self.router.poll(timeout_ms):
            client, _, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= first:
                    self.router.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            self.router.send_multipart((client, b"", END_SEQ, b""))
            served += 1
            timeout_ms = 0
        return served

    def close(self) -> None:
        self.pub.close(0)
        self.router.close(0)
        self.context.term()
