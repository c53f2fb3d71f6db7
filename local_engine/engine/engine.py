"""The engine: a worker thread runs steps; each step is one forward pass over one batch of running requests.

A request goes tokenize -> queue -> admit (radix match + lock + slots for the uncached rest) -> prefill, in chunks
within the step token budget -> decode, one token per step, batched with every other running request -> insert
prompt + output into the tree -> unlock -> report. K/V live only in the pool: attention reads each request's
context through its slot table and writes new K/V straight into its slots. The Scheduler decides what runs in each
step; SequenceKV does the tree and slot work under `tree_lock`, which the HTTP side also takes for its cache views.

With lower tiers (`--host-cache-*`, `--disk-cache-dir`), admission also loads the host/disk part of a match back into
device slots before prefill; the disk tier is indexed at start and written down at stop (and at the end of a drain).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque

from local_engine.cache import NoPrefixCache, RadixCache, RadixCacheConfig
from local_engine.cache.block_events import BlockEvents
from local_engine.cache.protocol import PrefixCache
from local_engine.cache.tiers.cleaner import CLEAN_CHUNK_TOKENS
from local_engine.cache.tiers import RETENTION_CLASSES, TierTokens
from local_engine.config import EngineConfig
from local_engine.engine.compute_threads import claim_worker_threads
from local_engine.engine.counters import EngineCounters
from local_engine.engine.types import Finished, GenerationRequest, MatchReport, RequestHandle, TokenDelta
from local_engine.engine.kv_tiers import build_device_pool, build_tier_store, tiers_summary
from local_engine.kv_events.publisher import KvEventPublisher
from local_engine.errors import CapacityExceeded, EngineError, EngineStopped, InvalidRequest
from local_engine.model.decode_graphs import DecodeGraphSettings
from local_engine.model.loader import LoadedModel
from local_engine.model.runner import ModelRunner, ScheduledChunk
from local_engine.engine.batch_sampling import SampledToken, sample_rows
from local_engine.engine.prompt_logprobs import add_prompt_logprobs, send_prompt_logprobs
from local_engine.engine.scheduler import Scheduler, SchedulerConfig, StepPlan
from local_engine.engine.sequence import Sequence
from local_engine.engine.sequence_builder import SequenceBuilder
from local_engine.engine.sequence_kv import SequenceKV

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, config: EngineConfig, loaded: LoadedModel) -> None:
        self.config = config
        self.loaded = loaded
        pool_config = ModelRunner.pool_config_for(loaded.model, loaded.device, loaded.dtype)
        self.pool, self.allocator = build_device_pool(config, pool_config)  # the pool's last slot: a scratch slot
        self.tiers = None
        self.kv_events: KvEventPublisher | None = None  # None without a prefix cache: nothing to publish
        if config.prefix_cache:
            cache_config = RadixCacheConfig(page_size=config.page_size, eviction=config.eviction, ttl_s=config.ttl_s)
            self.tiers = build_tier_store(config, self.pool, self.allocator, loaded.model, loaded.model_id)
            events = BlockEvents(config.kv_events.block_size)
            self.cache: PrefixCache = RadixCache(cache_config, self.allocator, tiers=self.tiers, events=events)
            self.kv_events = KvEventPublisher(config.kv_events, events.announced_events)
            events.attach(self.kv_events.enqueue)
            if self.tiers.disk is not None:
                self.cache.tiers.rebuild()  # headers only: the KV stays on disk until a request needs it
        else:
            self.cache = NoPrefixCache(self.allocator)
        num_slots = self.allocator.num_slots
        graphs = DecodeGraphSettings(max_batch=config.max_num_seqs,
                                     max_context=min(loaded.context_window_tokens, num_slots), scratch_slot=num_slots)
        self.runner = ModelRunner(loaded.model, self.pool, config.attention_backend, decode_graphs=graphs,
                                  enforce_eager=config.enforce_eager, batch_invariant=config.batch_invariant,
                                  cpu_kernels_mode=config.cpu_kernels)
        self.counters = EngineCounters()
        self.tree_lock = threading.Lock()
        self.kv = SequenceKV(self.cache, self.allocator, self.tree_lock, self.pool)
        self.sequences = SequenceBuilder(loaded)
        self.scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens), self.kv)
        self.num_steps = 0
        self._wakeup = threading.Condition()
        self._incoming: deque[Sequence] = deque()
        self._stopping = False
        self._drain_deadline: float | None = None  # set by begin_drain: no new requests, finish by this time
        self._thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        self._closed = False

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker (and the KV-event publisher: raises OSError when its address is taken)."""
        if self.kv_events is not None:
            self.kv_events.start()
        self._thread.start()

    def stop(self) -> None:
        """Stop now: requests still in flight fail with EngineStopped; every lock and slot is released. With a disk
        tier, every cached prefix not yet on disk is written there (within its capacity) and the directory's lock is
        released."""
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._close_tiers()
        if self.kv_events is not None:
            self.kv_events.close()

    def tiers_summary(self) -> str:
        return tiers_summary(self.tiers) if self.tiers is not None else ""

    def _close_tiers(self) -> None:
        """Once, after the worker is gone: persist the cache to the disk tier and unlock its directory."""
        with self.tree_lock:
            if self._closed:
                return
            self._closed = True
            if self.tiers is None or self.tiers.disk is None:
                return
            try:
                written = self.cache.tiers.persist()
                log.info("disk KV cache: wrote %d tokens to %s at stop", written, self.tiers.disk.directory)
            finally:
                self.tiers.disk.close()

    def begin_drain(self, grace_s: float) -> None:
        """Stop admitting (new submits get EngineStopped); requests in flight may finish within `grace_s` seconds,
        then the rest are cancelled and the worker exits. Returns at once; `wait_drained` waits for the end."""
        with self._wakeup:
            if self._drain_deadline is None:
                self._drain_deadline = time.monotonic() + grace_s
            self._wakeup.notify_all()

    def wait_drained(self, timeout_s: float) -> bool:
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()

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
        if request.retention is not None and request.retention not in RETENTION_CLASSES:
            raise InvalidRequest(f"cache_retention must be one of {list(RETENTION_CLASSES)}", param="cache_retention")
        self.check_fits_window(len(request.prompt_token_ids), request.sampling.max_tokens)
        if len(request.prompt_token_ids) > self.allocator.num_slots:
            raise CapacityExceeded.pool_too_small(len(request.prompt_token_ids), self.allocator.num_slots)
        handle = RequestHandle(asyncio.get_running_loop(), num_sequences=request.sampling.num_sequences)
        sequence = await self.sequences.build(request, handle)
        with self._wakeup:
            if self._stopping or self._drain_deadline is not None:
                raise EngineStopped("the engine is shutting down")
            if len(self._incoming) + len(self.scheduler.waiting) >= self.config.max_waiting_requests:
                raise CapacityExceeded("too many requests are waiting; retry later")
            self._incoming.append(sequence)
            self._wakeup.notify()
        try:
            await asyncio.shield(handle.report)
        except asyncio.CancelledError:
            handle.cancel()
            raise
        return handle

    # ---- worker thread ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        claim_worker_threads()
        while True:
            if self._idle() and self._clean_while_idle():
                continue  # copied some KV down; look for requests before the next piece
            with self._wakeup:
                while not self._stopping and not self._incoming and not self.scheduler.has_work():
                    if self._drain_deadline is not None:
                        break
                    self._wakeup.wait()
                if self._stopping:
                    break
                draining_done = self._drain_deadline is not None and (
                    time.monotonic() >= self._drain_deadline
                    or not (self._incoming or self.scheduler.has_work())
                )
                if draining_done:
                    break
                while self._incoming:
                    self.scheduler.add(self._incoming.popleft())
            busy_start = time.perf_counter()
            try:
                self.step()
            except Exception:  # noqa: BLE001 - a failed step fails its requests, never the worker
                log.exception("engine step failed")
                self._fail_all(EngineError("generation failed in the engine"))
            self.counters.engine_busy_s += time.perf_counter() - busy_start
        with self._wakeup:
            leftover = list(self._incoming)
            self._incoming.clear()
        self._fail_all(EngineStopped("the engine stopped"), extra=leftover)
        # Both stop paths (stop() and a SIGTERM drain) end here: keep the cache for the next start.
        self._close_tiers()

    def _idle(self) -> bool:
        with self._wakeup:
            return not (self._stopping or self._incoming or self.scheduler.has_work()
                        or self._drain_deadline is not None)

    def _clean_while_idle(self) -> bool:
        """Write-back cleaning (`cache.tiers.clean`): give the device nodes next in line for eviction a host copy
        now, so the request that later needs their room does not wait for the copy. True when something was copied."""
        if self.tiers is None or self.tiers.write_through or self.tiers.host_pool is None:
            return False
        with self.tree_lock:
            # One piece per tick: the tree lock (which the HTTP side's cache views take too) is let go between pieces,
            # and the worker looks for requests after each (a bare deque read also stops it before starting one).
            return self.cache.tiers.clean(max_tokens=CLEAN_CHUNK_TOKENS, should_stop=lambda: bool(self._incoming)) > 0

    def step(self) -> None:
        """One scheduling decision and one forward pass (the worker's loop body; tests may drive it directly)."""
        started = time.perf_counter()
        for sequence in list(self.scheduler.running) + list(self.scheduler.waiting):
            if sequence.handle.cancelled:
                self._finish(sequence, "cancelled")
        plan = self.scheduler.schedule()
        self._apply_admissions(plan)
        if plan.chunks:
            self._forward(plan, schedule_s=time.perf_counter() - started)
        self.num_steps += 1

    def _apply_admissions(self, plan: StepPlan) -> None:
        for sequence in plan.rejected:
            self._fail(sequence, CapacityExceeded.pool_too_small(len(sequence.token_ids), self.allocator.num_slots))
        for sequence, match in plan.admitted:
            if sequence.num_preemptions == 0:
                sequence.matched_tokens = match.matched_tokens
                self.counters.count_admission(match.miss_kind, len(sequence.prompt), match.matched_tokens)
                if self.tiers is not None:
                    tier_tokens = match.tier_tokens or TierTokens(device=match.matched_tokens)
                    for counter, tokens in zip(self.tiers.counters, (tier_tokens.device, tier_tokens.host,
                                                                     tier_tokens.disk)):
                        counter.hit_tokens_total += tokens
                report = MatchReport.of(match, len(sequence.prompt), self.cache.page_size)
                sequence.handle._resolve_report(report)
        self.counters.preemptions += len(plan.preempted)

    def _forward(self, plan: StepPlan, schedule_s: float) -> None:
        chunks = []
        for sequence, num_tokens in plan.chunks:
            start = sequence.num_computed_tokens
            end = start + num_tokens
            chunks.append(ScheduledChunk(sequence.token_ids[start:end], sequence.slot_table[:end],
                                         end == len(sequence.token_ids),
                                         all_logits=sequence.computes_whole_prompt and start < len(sequence.prompt)))
        started = time.perf_counter()
        step = self.runner.run(chunks)
        sampling = [sequence for (sequence, _), chunk in zip(plan.chunks, chunks) if chunk.needs_logits]
        elapsed = time.perf_counter() - started
        num_prefill = sum(n for s, n in plan.chunks if n > 1 or s.num_computed_tokens < len(s.prompt))
        self.counters.count_prefill(num_prefill, elapsed * num_prefill / plan.num_tokens)
        for index, chunk_logits in step.chunk_logits.items():
            add_prompt_logprobs(plan.chunks[index][0], chunk_logits)
        for sequence, num_tokens in plan.chunks:
            sequence.num_computed_tokens += num_tokens
        rows, groups = [], []
        for row, sequence in enumerate(sampling):
            if sequence.needs_store:
                self.kv.store(sequence)  # the prompt (or, after preemption, everything so far) is computed
                sequence.needs_store = False
            send_prompt_logprobs(sequence)
            if sequence.request.sampling.max_tokens == 0:  # `echo` of the prompt alone
                self._finish(sequence, "length")
                continue
            rows.append(row)
            groups.append([sequence] + self.scheduler.start_forks(sequence))
        samplers = [[s.sampler for s in group] for group in groups]
        sampling_started = time.perf_counter()
        drawn = sample_rows(step.logits[rows], samplers, self.sequences.grammar_masks)
        emit_started = time.perf_counter()
        for group, tokens in zip(groups, drawn):
            for sequence, token in zip(group, tokens):
                self._accept_token(sequence, token)
        if not num_prefill:
            self.counters.decode_steps.add(schedule_s, elapsed, emit_started - sampling_started,
                                           time.perf_counter() - emit_started)

    def _accept_token(self, sequence: Sequence, sampled: SampledToken) -> None:
        token_id = sampled.token_id
        now = time.perf_counter()
        if sequence.num_generated == 0:
            sequence.first_token_s = now
            sequence.prefill_s = now - sequence.admitted_s
        else:
            self.counters.count_inter_token(now - sequence.last_token_s)
        sequence.last_token_s = now
        sequence.token_ids.append(token_id)
        sequence.cumulative_logprob += sampled.logprob
        params = sequence.request.sampling
        logprobs = (sampled.entry,) if sampled.entry is not None else ()  # EOS's too, as vLLM reports it
        if token_id in self.loaded.eos_token_ids and not params.ignore_eos:
            self._emit_text(sequence, sequence.detokenizer.flush(), logprobs)
            self._finish(sequence, "stop")
            return
        text = sequence.detokenizer.feed(token_id)
        if sequence.detokenizer.stopped:
            self._emit_text(sequence, text, logprobs)
            self._finish(sequence, "stop")
        elif sequence.num_generated >= params.max_tokens:
            self._emit_text(sequence, text + sequence.detokenizer.flush(), logprobs)
            self._finish(sequence, "length")
        else:
            sequence.handle._emit(TokenDelta(text, (token_id,), sequence.index, logprobs))

    def _emit_text(self, sequence: Sequence, text: str, logprobs: tuple = ()) -> None:
        sequence.handle._emit(TokenDelta(text, (sequence.last_token,), sequence.index, logprobs))

    def _finish(self, sequence: Sequence, reason: str) -> None:
        if sequence.admission_id < 0 and reason == "cancelled":
            self.scheduler.remove(sequence)
            sequence.handle._fail(EngineError("cancelled before it started", code="cancelled"))
            return
        sequence.finish_reason = reason
        self.kv.remember_answered(sequence)
        if sequence.first_token_s:
            sequence.decode_s = time.perf_counter() - sequence.first_token_s
        if sequence.locked_node is not None or sequence.num_slots:
            # Index prompt + output so a follow-up turn reuses the answer's KV too.
            self.kv.store(sequence)
            self.kv.release(sequence)
        self.scheduler.remove(sequence)
        timings = sequence.timings()
        self.counters.count_finish(sequence.num_generated, timings, reason)
        sequence.handle._emit(
            Finished(
                reason,
                len(sequence.prompt),
                sequence.num_generated,
                sequence.matched_tokens,
                timings,
                sequence.detokenizer.matched_stop,
                index=sequence.index,
                cumulative_logprob=sequence.cumulative_logprob,
            )
        )
        # Sequences still held (the request ended before its first token): they end the same way, with nothing.
        for held in sequence.forks:
            held.handle._emit(Finished(reason, len(held.prompt), 0, sequence.matched_tokens, timings, index=held.index))
        sequence.forks = []

    def _fail(self, sequence: Sequence, error: EngineError) -> None:
        if sequence.locked_node is not None or sequence.num_slots:
            self.kv.release(sequence)
        self.scheduler.remove(sequence)
        self.counters.failed_requests += 1
        sequence.handle._fail(error)
        sequence.handle.cancel()  # the request's other sequences (`n`) stop at the next step

    def _fail_all(self, error: EngineError, extra: list[Sequence] = ()) -> None:
        for sequence in list(self.scheduler.running) + list(self.scheduler.waiting) + list(extra):
            self._fail(sequence, error)

    # ---- read-only views for the HTTP side ----------------------------------------------------------------------

    def dry_run_match(self, namespace: str, token_ids: list[int]) -> MatchReport:
        with self.tree_lock:
            match = self.cache.match(namespace, token_ids, dry_run=True)
        return MatchReport.of(match, len(token_ids), self.cache.page_size)

    def cache_stats(self) -> dict:
        with self.tree_lock:
            stats = self.cache.stats().as_dict()
            stats["tiers"] = self.cache.tier_stats()
        if self.tiers is None:
            stats["tiers"]["device"]["capacity_bytes"] = self.pool.num_bytes
        stats.update(self.counters.derived())
        stats["active_requests"] = len(self.scheduler.running)
        stats["waiting_requests"] = len(self.scheduler.waiting) + len(self._incoming)
        stats["pool_bytes"] = self.pool.num_bytes
        if self.kv_events is not None:  # where a router subscribes, and the block size of what it will read there
            stats["kv_events"] = {**self.kv_events.describe(), "block_size": self.cache.events.block_size,
                                  "held_blocks": self.cache.events.num_held_blocks()}
        return stats

    def tree_snapshot(self, max_nodes: int) -> dict:
        with self.tree_lock:
            return self.cache.snapshot(max_nodes)

    def flush_cache(self) -> int:
        with self.tree_lock:
            return self.cache.flush()

    def check_integrity(self) -> None:
        """For tests, between steps: every slot is free, cached or held by a running request."""
        with self.tree_lock:
            held = self.kv.num_slots_outside_tree(self.scheduler.running)
            self.cache.check_integrity(num_slots_outside_tree=held)
