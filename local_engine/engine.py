"""The engine: one worker thread runs every request as tokenize -> match -> lock -> allocate -> prefill the suffix
-> decode -> insert -> unlock -> report.

Requests wait in a queue; up to `max_active_requests` are admitted and decoded one step each in turn, so a long
answer does not hold up the first token of the next request. The radix tree, the allocator and the pool are touched
only under `tree_lock`, which the HTTP side also takes for its read-only cache views.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque

import torch

from local_engine.cache import KVPool, NoPrefixCache, RadixCache, RadixCacheConfig, SlotAllocator
from local_engine.config import DEFAULT_KV_CACHE_TOKENS, EngineConfig
from local_engine.detokenizer import IncrementalDetokenizer
from local_engine.engine_counters import EngineCounters
from local_engine.engine_types import Finished, GenerationRequest, MatchReport, RequestHandle, TokenDelta
from local_engine.errors import CapacityExceeded, EngineError, EngineStopped, InvalidRequest
from local_engine.model_loader import LoadedModel
from local_engine.model_runner import ModelRunner
from local_engine.sampling import Sampler
from local_engine.sequence import Sequence


log = logging.getLogger(__name__)


class _Deferred(Exception):
    """Admission must wait: the pool is full of other active requests' KV, which they will release."""


class Engine:
    def __init__(self, config: EngineConfig, loaded: LoadedModel) -> None:
        self.config = config
        self.loaded = loaded
        pool_config = ModelRunner.pool_config_for(loaded.model, loaded.device, loaded.dtype)
        if config.kv_cache_gib is not None:
            num_slots = pool_config.num_slots_for_gib(config.kv_cache_gib)
        else:
            num_slots = config.kv_cache_tokens or DEFAULT_KV_CACHE_TOKENS
        self.pool = KVPool(pool_config, num_slots)
        self.allocator = SlotAllocator(num_slots)
        if config.prefix_cache:
            cache_config = RadixCacheConfig(page_size=config.page_size, eviction=config.eviction, ttl_s=config.ttl_s)
            self.cache: RadixCache | NoPrefixCache = RadixCache(cache_config, self.allocator)
        else:
            self.cache = NoPrefixCache(self.allocator)
        self.runner = ModelRunner(loaded.model, self.pool)
        self.counters = EngineCounters()
        self.tree_lock = threading.Lock()
        self._wakeup = threading.Condition()
        self._waiting: deque[Sequence] = deque()
        self._active: list[Sequence] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    # ---- requests -----------------------------------------------------------------------------------------------

    def check_fits_window(self, num_prompt_tokens: int, max_tokens: int) -> None:
        window = self.loaded.context_window_tokens
        if num_prompt_tokens + max_tokens > window:
            raise InvalidRequest(
                f"this model's context window is {window} tokens; the prompt has {num_prompt_tokens} and "
                f"max_tokens asks for {max_tokens} more",
                param="max_tokens" if num_prompt_tokens < window else "messages",
                code="context_length_exceeded",
            )

    async def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue a request; returns once it is admitted, with `handle.report` resolved (or raises EngineError)."""
        if not request.prompt_token_ids:
            raise InvalidRequest("the prompt is empty", param="prompt")
        self.check_fits_window(len(request.prompt_token_ids), request.sampling.max_tokens)
        handle = RequestHandle(asyncio.get_running_loop())
        sequence = Sequence(
            request=request,
            handle=handle,
            detokenizer=IncrementalDetokenizer(self.loaded.tokenizer, request.sampling.stop),
            sampler=Sampler(request.sampling),
        )
        with self._wakeup:
            if self._stopping:
                raise EngineStopped("the engine is shutting down")
            if len(self._waiting) >= self.config.max_waiting_requests:
                raise CapacityExceeded("too many requests are waiting; retry later")
            self._waiting.append(sequence)
            self._wakeup.notify()
        try:
            await asyncio.shield(handle.report)
        except asyncio.CancelledError:
            handle.cancel()
            raise
        return handle

    # ---- worker thread ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while not self._stopping and not self._waiting and not self._active:
                    self._wakeup.wait()
                if self._stopping:
                    break
            busy_start = time.perf_counter()
            self._admit_waiting()
            for sequence in list(self._active):
                self._guarded(sequence, self._step)
            self.counters.engine_busy_s += time.perf_counter() - busy_start
        for sequence in list(self._active) + list(self._waiting):
            self._release(sequence)
            sequence.handle._fail(EngineStopped("the engine stopped"))

    def _admit_waiting(self) -> None:
        while len(self._active) < self.config.max_active_requests:
            with self._wakeup:
                if not self._waiting:
                    return
                sequence = self._waiting.popleft()
            try:
                self._guarded(sequence, self._admit)
            except _Deferred:
                with self._wakeup:
                    self._waiting.appendleft(sequence)
                return

    def _guarded(self, sequence: Sequence, action) -> None:
        """Run one step of a request; an error ends that request alone, never the worker."""
        try:
            action(sequence)
        except _Deferred:
            raise
        except Exception as exc:  # noqa: BLE001 - the error goes back to the client; the engine keeps serving
            if not isinstance(exc, EngineError):
                log.exception("request failed in the engine")
            error = exc if isinstance(exc, EngineError) else EngineError(f"generation failed: {exc}")
            self.counters.failed_requests += 1
            self._release(sequence)
            if sequence in self._active:
                self._active.remove(sequence)
            sequence.handle._fail(error)

    def _alloc_slots(self, num_tokens: int) -> torch.Tensor | None:
        """Caller holds `tree_lock`. Evicts unlocked prefixes when the free list is short."""
        slots = self.allocator.alloc(num_tokens)
        if slots is None:
            self.cache.evict(num_tokens - self.allocator.num_free)
            slots = self.allocator.alloc(num_tokens)
        return slots

    def _admit(self, sequence: Sequence) -> None:
        if sequence.handle.cancelled:
            sequence.handle._fail(EngineError("cancelled before it started", code="cancelled"))
            return
        prompt = list(sequence.prompt)
        started = time.perf_counter()
        with self.tree_lock:
            match = self.cache.match(sequence.namespace, prompt)
            self.cache.lock(match.node)
            suffix_slots = self._alloc_slots(len(prompt) - match.matched_tokens)
            if suffix_slots is None:
                self.cache.unlock(match.node)
                if self._active:
                    raise _Deferred()
                raise CapacityExceeded(
                    f"the prompt needs {len(prompt) - match.matched_tokens} KV slots but the pool holds "
                    f"{self.allocator.num_slots} and only {self.allocator.num_free} could be freed",
                    code="kv_cache_full",
                )
        sequence.locked_node = match.node
        sequence.pending_slots = suffix_slots
        sequence.matched_tokens = match.matched_tokens
        sequence.admitted_s = time.perf_counter()
        sequence.bookkeeping_s += sequence.admitted_s - started
        self._active.append(sequence)
        self.counters.count_admission(match.miss_kind, len(prompt), match.matched_tokens)
        sequence.handle._resolve_report(MatchReport(len(prompt), match.matched_tokens, match.miss_kind))

        capacity = len(prompt) + sequence.request.sampling.max_tokens
        sequence.working = self.runner.new_working_kv(match.slots, capacity)
        output = self.runner.forward(sequence.working, prompt[match.matched_tokens :])
        sequence.prefill_s = time.perf_counter() - sequence.admitted_s
        self.counters.count_prefill(len(prompt) - match.matched_tokens, sequence.prefill_s)

        started, kv_write_before = time.perf_counter(), sequence.kv_write_s
        with self.tree_lock:
            self._store(sequence, prompt, match.slots, suffix_slots, match.matched_tokens)
            sequence.pending_slots = None
        sequence.bookkeeping_s += time.perf_counter() - started - (sequence.kv_write_s - kv_write_before)
        self._accept_token(sequence, sequence.sampler.next_token(output.logits))

    def _store(self, sequence: Sequence, token_ids: list[int], known_slots, new_slots, num_known: int) -> None:
        """Caller holds `tree_lock`. Index `token_ids` whose first `num_known` are already in the tree under
        `known_slots`; `new_slots` are fresh slots for the rest. Writes back only what the tree keeps, frees the
        rest, and moves this request's lock to the stored node."""
        result = self.cache.insert(sequence.namespace, token_ids, torch.cat([known_slots, new_slots]))
        keep_from = max(num_known, result.num_cached_tokens)
        keep_to = max(keep_from, result.num_stored_tokens)
        copy_started = time.perf_counter()
        self.runner.write_back(sequence.working, keep_from, keep_to, new_slots[keep_from - num_known : keep_to - num_known])
        # Copying KV into the pool is model-runner work, not tree bookkeeping: keep the two apart in the timings.
        sequence.kv_write_s += time.perf_counter() - copy_started
        self.allocator.free(new_slots[: keep_from - num_known])
        self.allocator.free(new_slots[keep_to - num_known :])
        self.cache.lock(result.node)
        self.cache.unlock(sequence.locked_node)
        sequence.locked_node = result.node
        sequence.stored_prompt_tokens = max(sequence.stored_prompt_tokens, result.num_stored_tokens)

    def _step(self, sequence: Sequence) -> None:
        if sequence.handle.cancelled:
            self._finish(sequence, "cancelled")
            return
        started = time.perf_counter()
        output = self.runner.forward(sequence.working, [sequence.last_token])
        sequence.decode_s += time.perf_counter() - started
        self._accept_token(sequence, sequence.sampler.next_token(output.logits))

    def _accept_token(self, sequence: Sequence, token_id: int) -> None:
        if not sequence.generated:
            sequence.first_token_s = time.perf_counter()
        sequence.generated.append(token_id)
        params = sequence.request.sampling
        if token_id in self.loaded.eos_token_ids and not params.ignore_eos:
            self._emit_text(sequence, sequence.detokenizer.flush())
            self._finish(sequence, "stop")
            return
        text = sequence.detokenizer.feed(token_id)
        if sequence.detokenizer.stopped:
            self._emit_text(sequence, text)
            self._finish(sequence, "stop")
        elif len(sequence.generated) >= params.max_tokens:
            self._emit_text(sequence, text + sequence.detokenizer.flush())
            self._finish(sequence, "length")
        else:
            sequence.handle._emit(TokenDelta(text, (token_id,)))

    def _emit_text(self, sequence: Sequence, text: str) -> None:
        sequence.handle._emit(TokenDelta(text, (sequence.last_token,)))

    def _finish(self, sequence: Sequence, reason: str) -> None:
        sequence.finish_reason = reason
        started, kv_write_before = time.perf_counter(), sequence.kv_write_s
        with self.tree_lock:
            self._store_output(sequence)
        sequence.bookkeeping_s += time.perf_counter() - started - (sequence.kv_write_s - kv_write_before)
        self._release(sequence)
        self._active.remove(sequence)
        timings = sequence.timings()
        self.counters.count_finish(len(sequence.generated), timings)
        sequence.handle._emit(
            Finished(
                reason,
                len(sequence.prompt),
                len(sequence.generated),
                sequence.matched_tokens,
                timings,
                sequence.detokenizer.matched_stop,
            )
        )

    def _store_output(self, sequence: Sequence) -> None:
        """Caller holds `tree_lock`. Index prompt + output so a follow-up turn reuses the answer's KV too."""
        token_ids = sequence.computed_token_ids()
        base = sequence.stored_prompt_tokens
        if isinstance(self.cache, NoPrefixCache) or len(token_ids) - base < self.cache.page_size:
            return
        new_slots = self._alloc_slots(len(token_ids) - base)
        if new_slots is None:
            return  # no room: the answer is simply not cached
        # The stored prompt is locked by this request, so the tree still holds exactly `base` tokens of it.
        known = self.cache.match(sequence.namespace, token_ids[: base + 1], dry_run=True)
        self._store(sequence, token_ids, known.slots, new_slots, base)

    def _release(self, sequence: Sequence) -> None:
        """Drop the request's lock on the tree, its unstored slots and its working KV."""
        with self.tree_lock:
            if sequence.locked_node is not None:
                self.cache.unlock(sequence.locked_node)
                sequence.locked_node = None
            if sequence.pending_slots is not None:
                self.allocator.free(sequence.pending_slots)
                sequence.pending_slots = None
        if sequence.working is not None:
            self.runner.release(sequence.working)
            sequence.working = None

    # ---- read-only views for the HTTP side ----------------------------------------------------------------------

    def dry_run_match(self, namespace: str, token_ids: list[int]) -> MatchReport:
        with self.tree_lock:
            match = self.cache.match(namespace, token_ids, dry_run=True)
        return MatchReport(len(token_ids), match.matched_tokens, match.miss_kind)

    def cache_stats(self) -> dict:
        with self.tree_lock:
            stats = self.cache.stats().as_dict()
        stats.update(self.counters.derived())
        stats["active_requests"] = len(self._active)
        stats["waiting_requests"] = len(self._waiting)
        stats["pool_bytes"] = self.pool.num_bytes
        return stats

    def tree_snapshot(self, max_nodes: int) -> dict:
        with self.tree_lock:
            return self.cache.snapshot(max_nodes)

    def flush_cache(self) -> int:
        with self.tree_lock:
            return self.cache.flush()

    def check_integrity(self) -> None:
        """For tests, between requests: every slot is free, cached or held by an admitted request."""
        with self.tree_lock:
            pending = sum(s.pending_slots.numel() for s in self._active if s.pending_slots is not None)
            self.cache.check_integrity(num_slots_outside_tree=pending)
