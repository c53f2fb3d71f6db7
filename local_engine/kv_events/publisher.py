"""Publishing KV events over ZeroMQ the way vLLM's and SGLang's `ZmqEventPublisher` do, without ever blocking a step.

The engine's step thread hands each change's events to `enqueue`, which only appends to a bounded queue. A publisher
thread drains the queue into one `KVEventBatch` at a time, numbers it (from 0), sends `[topic, seq, payload]` on a PUB
socket and keeps the last `buffer_batches` batches for replay. A ROUTER socket answers a replay request (one frame:
the first wanted sequence number, 8-byte big-endian) with `[seq, payload]` for every retained batch from there, then
`[-1, b""]`. A slow subscriber whose PUB queue overflows (the high-water mark) misses batches that the replay still
holds, so nothing is lost to it; a full queue on the engine side loses events, which are counted, and the next batch
is the whole current state (`AllBlocksCleared` then a `BlockStored` per held block), so every subscriber catches up.

The first batch of every process is that whole state too (an empty cache: just `AllBlocksCleared`), so a subscriber
tells a restarted engine by a sequence number going back and an `AllBlocksCleared` at its start.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import zmq

from local_engine.kv_events.config import KvEventsConfig
from local_engine.kv_events.wire import END_OF_REPLAY_SEQ, KVCacheEvent, KVEventBatch, encode_seq

log = logging.getLogger(__name__)

_MAX_BATCH_EVENTS = 2048  # events per batch; a step's changes rarely need more than one batch


@dataclass
class PublisherCounters:
    batches_total: int = 0
    events_total: int = 0
    lost_events_total: int = 0  # dropped because the queue was full (then re-announced)
    reannouncements_total: int = 0
    replay_requests_total: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class KvEventPublisher:
    """Numbers and sends the events of one engine; `since` is the HTTP view of the same retained batches."""

    def __init__(self, config: KvEventsConfig, whole_state: Callable[[], list[KVCacheEvent]]) -> None:
        self.config = config
        self.counters = PublisherCounters()
        self.bound_endpoint: str | None = None  # the PUB socket's address once bound (a port 0 resolved)
        self.bound_replay_endpoint: str | None = None
        self._whole_state = whole_state
        self._queue: queue.Queue[list[KVCacheEvent]] = queue.Queue(maxsize=config.max_queue_changes)
        self._reannounce = threading.Event()
        self._reannounce.set()  # the first batch is the whole state
        self._buffer: deque[tuple[int, float, bytes]] = deque(maxlen=config.buffer_batches)
        self._buffer_lock = threading.Lock()
        self._next_seq = 0
        self._encoder = msgspec.msgpack.Encoder()
        self._running = False
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None

    # ---- the step thread's side ---------------------------------------------------------------------------------

    def enqueue(self, events: list[KVCacheEvent]) -> None:
        """Never blocks: a full queue loses `events` (counted) and makes the next batch the whole state."""
        try:
            self._queue.put_nowait(events)
        except queue.Full:
            self.counters.lost_events_total += len(events)
            self._reannounce.set()

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the sockets (raises OSError when an address is taken or malformed) and start the publisher thread."""
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error

    def close(self) -> None:
        self._running = False
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ---- reading (HTTP view) ------------------------------------------------------------------------------------

    def since(self, after_seq: int, limit: int) -> dict:
        """Retained batches with `seq > after_seq`, oldest first, at most `limit`, as sent (`events` in the wire's
        array form). `gap` is true when some batch after `after_seq` is no longer retained."""
        with self._buffer_lock:
            retained = list(self._buffer)
            last = self._next_seq - 1
        oldest = retained[0][0] if retained else last + 1
        gap = after_seq > last or after_seq + 1 < oldest
        batches = [
            {"seq": seq, "ts": ts, "events": msgspec.msgpack.decode(payload)[1]}
            for seq, ts, payload in retained if seq > after_seq
        ][:limit]
        return {"topic": self.config.topic, "last_seq": last, "gap": gap, "batches": batches}

    def describe(self) -> dict:
        """For `/v1/cache`: where the stream is and its counters."""
        return {
            "endpoint": self.bound_endpoint,
            "replay_endpoint": self.bound_replay_endpoint,
            "topic": self.config.topic,
            "last_seq": self._next_seq - 1,
            **self.counters.as_dict(),
        }

    # ---- the publisher thread -----------------------------------------------------------------------------------

    def _run(self) -> None:
        context = zmq.Context.instance()
        pub = replay = None
        try:
            if self.config.endpoint is not None:
                pub = context.socket(zmq.PUB)
                pub.set_hwm(self.config.hwm)
                pub.setsockopt(zmq.LINGER, 0)
                pub.bind(self.config.endpoint)
                self.bound_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            if self.config.replay_endpoint is not None:
                replay = context.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                replay.bind(self.config.replay_endpoint)
                self.bound_replay_endpoint = replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as error:
            self._start_error = OSError(f"kv events socket: {error}")
            for socket in (pub, replay):
                if socket is not None:
                    socket.close(0)
            self._ready.set()
            return
        self._ready.set()
        topic = self.config.topic.encode()
        try:
            while self._running:
                if replay is not None:
                    while replay.poll(0):
                        self._serve_replay(replay)
                events = self._next_events()
                if events:
                    self._send(pub, topic, events)
        finally:
            for socket in (pub, replay):
                if socket is not None:
                    socket.close(0)

    def _next_events(self) -> list[KVCacheEvent]:
        if self._reannounce.is_set():
            self._reannounce.clear()
            while True:  # what is queued is part of the state read next
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            self.counters.reannouncements_total += 1
            return self._whole_state()
        try:
            events = list(self._queue.get(timeout=0.05))
        except queue.Empty:
            return []
        while len(events) < _MAX_BATCH_EVENTS:
            try:
                events.extend(self._queue.get_nowait())
            except queue.Empty:
                break
        return events

    def _send(self, pub, topic: bytes, events: list[KVCacheEvent]) -> None:
        ts = time.time()
        payload = self._encoder.encode(KVEventBatch(ts=ts, events=events))
        with self._buffer_lock:
            seq = self._next_seq
            self._next_seq += 1
            self._buffer.append((seq, ts, payload))
        self.counters.batches_total += 1
        self.counters.events_total += len(events)
        if pub is not None:
            try:
                pub.send_multipart((topic, encode_seq(seq), payload), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass  # a subscriber that cannot keep up replays it from the buffer

    def _serve_replay(self, replay) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("kv events: ignoring a malformed replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        self.counters.replay_requests_total += 1
        with self._buffer_lock:
            retained = [(seq, payload) for seq, _, payload in self._buffer if seq >= first]
        for seq, payload in retained:
            replay.send_multipart((client, b"", encode_seq(seq), payload))
        replay.send_multipart((client, b"", END_OF_REPLAY_SEQ, b""))
