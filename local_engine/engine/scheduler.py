"""Which tokens run in the next engine step: policy only (SequenceKV does the slot and tree work).

Each step is one forward pass over one batch, within a token budget (`max_num_batched_tokens`) and a limit on
running requests (`max_num_seqs`), filled in this order:

1. one decode token for every running request that has finished its prompt, oldest first. When the pool runs dry
   for a decode slot, the newest running request is preempted: it gives back the slots it holds outside the tree,
   keeps nothing locked, and goes back to the head of the queue to be recomputed (mostly from cache) later;
2. the next prefill chunk of every running request still in its prompt (chunked prefill: a long prompt takes
   several steps while the others keep decoding);
3. new requests in FIFO order: radix match + lock + slots for the uncached rest, and their first chunk. The head of
   the queue waits while the pool is held by running requests; with nothing running, a prompt that still does not
   fit can never fit and is rejected.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from local_engine.cache import MatchResult
from local_engine.engine.sequence import Sequence
from local_engine.engine.sequence_kv import SequenceKV


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")


@dataclass
class StepPlan:
    """`chunks`: (request, number of its next tokens to compute) in the order they were scheduled."""

    chunks: list[tuple[Sequence, int]] = field(default_factory=list)
    admitted: list[tuple[Sequence, MatchResult]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    rejected: list[Sequence] = field(default_factory=list)  # can never fit in the pool

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: SequenceKV) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last one is the newest

    def add(self, sequence: Sequence) -> None:
        self.waiting.append(sequence)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, sequence: Sequence) -> None:
        """Forget a request that finished or failed (the caller releases its slots)."""
        if sequence in self.running:
            self.running.remove(sequence)
        elif sequence in self.waiting:
            self.waiting.remove(sequence)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.config.max_num_batched_tokens
        for sequence in list(self.running):
            if budget == 0:
                break
            if sequence not in self.running or sequence.is_prefilling:
                continue
            if self._reserve_decode_slot(sequence, plan):
                plan.chunks.append((sequence, 1))
                budget -= 1
        for sequence in self.running:
            if budget == 0:
                break
            if sequence.is_prefilling:
                num_tokens = min(sequence.num_uncomputed_tokens, budget)
                plan.chunks.append((sequence, num_tokens))
                budget -= num_tokens
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            sequence = self.waiting[0]
            match = self.kv.admit(sequence)
            if match is None:
                if not self.running:
                    plan.rejected.append(self.waiting.popleft())
                    continue
                break
            self.waiting.popleft()
            sequence.mark_admitted()
            self.running.append(sequence)
            plan.admitted.append((sequence, match))
            num_tokens = min(sequence.num_uncomputed_tokens, budget)
            plan.chunks.append((sequence, num_tokens))
            budget -= num_tokens
        return plan

    def start_forks(self, parent: Sequence) -> list[Sequence]:
        """At `parent`'s first token: the sequences it holds (`n`, `best_of`) start running from its computed
        prompt, sharing its KV (`SequenceKV.fork`), and are returned to draw their first tokens from the same logits.
        One that would take the running requests past `max_num_seqs`, or that the pool cannot take now, waits at the
        queue's head and is recomputed from the cache, as after a preemption."""
        if not parent.forks or parent.num_generated:
            return []
        held, parent.forks = parent.forks, []
        started = []
        for child in held:
            child.mark_admitted()
            child.matched_tokens, child.admitted_s, child.needs_store = parent.matched_tokens, parent.admitted_s, False
            if len(self.running) < self.config.max_num_seqs and self.kv.fork(parent, child):
                self.running.append(child)
                started.append(child)
            else:
                child.num_preemptions = 1  # counted and reported with its parent
                self.waiting.appendleft(child)
        return started

    def _reserve_decode_slot(self, sequence: Sequence, plan: StepPlan) -> bool:
        """A slot for `sequence`'s next token, preempting the newest running requests while the pool is dry."""
        while not self.kv.append_slot(sequence):
            victim = self.running[-1]
            self.preempt(victim)
            plan.preempted.append(victim)
            if victim is sequence:
                return False
        return True

    def preempt(self, sequence: Sequence) -> None:
        self.kv.release(sequence)
        sequence.reset_for_recompute()
        self.running.remove(sequence)
        self.waiting.appendleft(sequence)
