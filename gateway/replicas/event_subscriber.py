"""Following one replica's KV events over ZeroMQ (vLLM's, SGLang's and prefixscope's publisher, `docs/fleets.md`).

A SUB socket receives `[topic, seq, payload]`; a DEALER socket asks the publisher's ROUTER for a replay (one frame,
the first wanted sequence number) and reads `[seq, payload]` replies up to the `[-1, b""]` end marker. The
subscriber starts with a replay from 0 (everything the engine still holds), and then:

- a sequence number past the next expected one is a gap: the missing batches are replayed;
- a sequence number at or below the last one applied is a restarted engine (its publisher counts from 0 again):
  the index is cleared and rebuilt from a replay from 0;
- `AllBlocksCleared` empties the index (a flush, or the first batch of a new process);
- when the replica comes back after failing its health checks, the index is rebuilt the same way.

While a replay cannot be had (no answer within the timeout), or the replica is out, its events count as missing and
the router falls back to the approximate index for it (`synced` is False). Without a replay endpoint the subscriber
trusts the live stream from the moment it connects (a gap is then only counted).
"""

from __future__ import annotations

import asyncio
import logging

import zmq
import zmq.asyncio

from gateway.config.router import ReplicaEvents
from gateway.replicas.event_index import EventIndex
from gateway.replicas.kv_event_wire import Cleared, MalformedEvents, decode_batch

log = logging.getLogger(__name__)

_RECENT_BATCHES = 4096  # batches remembered to tell a replayed one arriving live from a restarted engine's
_END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


class EventSubscriber:
    """Keeps `index` in step with one replica's events; `run` is its task."""

    def __init__(self, index: EventIndex, events: ReplicaEvents, replay_timeout_s: float = 2.0) -> None:
        self.index = index
        self.events = events
        self.replay_timeout_s = replay_timeout_s
        self.synced = False
        self.last_seq: int | None = None
        self.batches = 0
        self.gaps = 0  # sequence gaps seen on the live stream
        self.replays = 0  # replays completed
        self.restarts = 0  # restarted engines detected
        self.incomplete_replays = 0  # replays that could not go back far enough (the publisher's buffer moved on)
        self.malformed = 0
        self._rebuild = asyncio.Event()
        self._context = zmq.asyncio.Context.instance()
        self._dealer: zmq.asyncio.Socket | None = None
        self._recent: dict[int, int] = {}  # seq -> hash of its payload, for the last batches applied

    def rebuild(self) -> None:
        """Drop everything and replay from 0 (the replica came back, possibly as a new process)."""
        self.synced = False
        self._rebuild.set()

    def unsync(self) -> None:
        """The replica is out: its events count as missing until it is back."""
        self.synced = False

    async def run(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.events.topic.encode())
        sub.connect(self.events.endpoint)
        try:
            await self._resync(from_start=True)
            while True:
                if self._rebuild.is_set():
                    self._rebuild.clear()
                    await self._resync(from_start=True)
                if not self.synced:
                    # still no replay: try again now and then; live batches keep the index as good as they can
                    if await self._poll(sub, 1.0) is None:
                        await self._resync(from_start=self.last_seq is None)
                    continue
                await self._poll(sub, 0.5)
        finally:
            sub.close(0)
            if self._dealer is not None:
                self._dealer.close(0)

    async def _poll(self, sub, timeout_s: float) -> int | None:
        if not await sub.poll(timeout_s * 1000):
            return None
        frames = await sub.recv_multipart()
        if len(frames) != 3 or len(frames[1]) != 8:
            self.malformed += 1
            return 0
        seq = int.from_bytes(frames[1], "big")
        if self.last_seq is not None and seq <= self.last_seq:
            if self._recent.get(seq) == hash(frames[2]):
                return 0  # already applied from a replay
            self.restarts += 1
            log.info("kv events %s: sequence went back (%d after %d): engine restarted", self.events.endpoint, seq,
                     self.last_seq)
            self.index.clear()
            self.last_seq = None
            await self._resync(from_start=True, live=(seq, frames[2]))
            return 1
        if self.last_seq is not None and seq > self.last_seq + 1:
            self.gaps += 1
            if self.events.replay_endpoint is not None:
                await self._replay_from(self.last_seq + 1, until=seq - 1)
        self._apply(seq, frames[2])
        return 1

    async def _resync(self, from_start: bool, live: tuple[int, bytes] | None = None) -> None:
        if self.events.replay_endpoint is None:
            self.synced = True
            if live is not None:
                self._apply(*live)
            return
        if from_start:
            self.index.clear()
            self.last_seq = None
            self._recent.clear()
        start = 0 if self.last_seq is None else self.last_seq + 1
        self.synced = await self._replay_from(start, until=None)
        if live is not None and (self.last_seq is None or live[0] > self.last_seq):
            self._apply(*live)

    async def _replay_from(self, start: int, until: int | None) -> bool:
        """Apply the retained batches from `start` (up to `until`); False when the publisher did not answer."""
        dealer = self._dealer
        if dealer is None:
            dealer = self._dealer = self._context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(self.events.replay_endpoint)
        await dealer.send_multipart((b"", start.to_bytes(8, "big")))
        first = True
        while True:
            if not await dealer.poll(self.replay_timeout_s * 1000):
                dealer.close(0)  # a reply may still come to this socket: start the next request on a fresh one
                self._dealer = None
                return False
            frames = await dealer.recv_multipart()
            if len(frames) != 3:
                self.malformed += 1
                continue
            _, seq_bytes, payload = frames
            if seq_bytes == _END_OF_REPLAY:
                self.replays += 1
                if self.last_seq is None or self.last_seq < start - 1:
                    self.last_seq = start - 1  # nothing from `start` on yet: the next batch is `start`
                return True
            seq = int.from_bytes(seq_bytes, "big")
            if first and seq > start:
                self.incomplete_replays += 1
            first = False
            if (self.last_seq is None or seq > self.last_seq) and (until is None or seq <= until):
                self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            events = decode_batch(payload)
        except MalformedEvents as error:
            self.malformed += 1
            log.debug("kv events %s: batch %d: %s", self.events.endpoint, seq, error)
            events = []
        if events and isinstance(events[0], Cleared) and seq == 0:
            self.index.clear()
        self.index.apply(events)
        self.last_seq = seq
        self.batches += 1
        self._recent[seq] = hash(payload)
        if len(self._recent) > _RECENT_BATCHES:
            del self._recent[next(iter(self._recent))]
