"""Slot tables of running requests against the radix cache and the slot allocator (what a block manager does).

Every method takes `tree_lock`, which the HTTP side also takes for its read-only cache views. The rules are the
cache's own: match + lock at admission, slots from the allocator (evicting unlocked prefixes when short), insert
into the tree once computed (freeing the request's duplicates of what another request stored first), unlock at the
end. What the tree holds is never freed by a request; what a request holds outside the tree is freed by it.
"""

from __future__ import annotations

import threading
import time

import torch

from local_engine.cache import KVPool, MatchResult, NoPrefixCache, SlotAllocator
from local_engine.cache.kv_pool import copy_slots
from local_engine.cache.protocol import PrefixCache
from local_engine.engine.sequence import Sequence


class SequenceKV:
    def __init__(self, cache: PrefixCache, allocator: SlotAllocator, tree_lock: threading.Lock,
                 pool: KVPool | None = None):
        """`pool`: the device pool, needed only to fork sequences (`fork` copies a tail of KV)."""
        self.cache = cache
        self.pool = pool
        self.allocator = allocator
        self.tree_lock = tree_lock

    def _alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Caller holds `tree_lock`. Evicts unlocked prefixes when the free list is short."""
        slots = self.allocator.alloc(num_tokens)
        if slots is None:
            self.cache.evict(num_tokens - self.allocator.num_free)
            slots = self.allocator.alloc(num_tokens)
        return slots

    def admit(self, sequence: Sequence) -> MatchResult | None:
        """Match the request's tokens across tiers, lock the match, allocate device slots for its host/disk part and
        the uncached rest, and load that part back into them (all or nothing); None (nothing held) when the pool
        cannot supply the slots even after evicting everything unlocked. The returned match is what was served."""
        started = time.perf_counter()
        tokens = sequence.token_ids
        with self.tree_lock:
            # A prompt whose log-probabilities are wanted is computed whole: the cache keeps no logits. Matching
            # only its first token matches nothing (the last token of a match is always computed).
            matched_part = tokens[:1] if sequence.computes_whole_prompt else tokens
            match = self.cache.match(sequence.namespace, matched_part, retention=sequence.request.retention)
            self.cache.lock(match.node)
            num_device = match.tier_tokens.device if match.tier_tokens is not None else match.matched_tokens
            slots = self._alloc(len(tokens) - num_device)
            if slots is None:
                self.cache.unlock(match.node)
                match = None
            else:
                if num_device < match.matched_tokens:
                    # The locked path is loaded into the first slots; a cut match leaves the rest to prefill.
                    match = self.cache.tiers.load_back(sequence.namespace, tokens, match, slots)
                sequence.slot_table[:num_device] = match.slots[:num_device]
                sequence.slot_table[num_device : len(tokens)] = slots
                sequence.num_slots = len(tokens)
                sequence.num_tree_slots = sequence.num_computed_tokens = match.matched_tokens
                sequence.locked_node = match.node
        # Loading is reported on its own (MatchReport.load_ms, per-tier counters), not as tree bookkeeping.
        load_s = match.load_ms / 1000 if match is not None else 0.0
        sequence.bookkeeping_s += max(0.0, time.perf_counter() - started - load_s)
        return match

    def fork(self, parent: Sequence, child: Sequence) -> bool:
        """Give `child` the KV of `parent`'s computed tokens: the part the tree holds is shared (the child locks the
        same node), the parent's own tail (less than a page; the whole prompt without a prefix cache) is copied
        into fresh slots. False (nothing held) when the pool cannot supply those slots."""
        started = time.perf_counter()
        num_tree, num_tokens = parent.num_tree_slots, parent.num_computed_tokens
        with self.tree_lock:
            slots = self._alloc(num_tokens - num_tree) if num_tokens > num_tree else parent.own_slots[:0].clone()
            if slots is None:
                return False
            if len(slots):
                copy_slots(self.pool, parent.slot_table[num_tree:num_tokens], self.pool, slots)
            self.cache.lock(parent.locked_node)
        child.slot_table[:num_tree] = parent.slot_table[:num_tree]
        child.slot_table[num_tree:num_tokens] = slots
        child.num_slots = child.num_computed_tokens = num_tokens
        child.num_tree_slots = num_tree
        child.locked_node = parent.locked_node
        child.bookkeeping_s += time.perf_counter() - started
        return True

    def append_slot(self, sequence: Sequence) -> bool:
        """One more slot for the token the next decode step computes; False when the pool is dry."""
        if sequence.num_slots >= len(sequence.token_ids):
            return True
        started = time.perf_counter()
        with self.tree_lock:
            slots = self._alloc(1)
        sequence.bookkeeping_s += time.perf_counter() - started
        if slots is None:
            return False
        sequence.slot_table[sequence.num_slots] = slots[0]
        sequence.num_slots += 1
        return True

    def store(self, sequence: Sequence) -> None:
        """Index the request's computed tokens in the tree and move its lock to the stored node."""
        started = time.perf_counter()
        with self.tree_lock:
            self._store(sequence)
        sequence.bookkeeping_s += time.perf_counter() - started

    def remember_answered(self, sequence: Sequence) -> None:
        """Remember the prompt and every generated token (the last one too, never computed) as seen: a follow-up
        turn re-sending the answer as returned re-sends tokens this request produced (`SeenIndex`)."""
        with self.tree_lock:
            self.cache.remember_seen(sequence.namespace, list(sequence.token_ids))

    def _store(self, sequence: Sequence) -> None:
        num_tokens, known = sequence.num_computed_tokens, sequence.num_tree_slots
        if isinstance(self.cache, NoPrefixCache) or num_tokens - known < self.cache.page_size:
            return
        token_ids = sequence.token_ids[:num_tokens]
        result = self.cache.insert(
            sequence.namespace, token_ids, sequence.slot_table[:num_tokens], retention=sequence.request.retention
        )
        keep_from = max(known, result.num_cached_tokens)
        keep_to = max(keep_from, result.num_stored_tokens)
        if keep_from > known:
            # Another request stored [known, keep_from) first: read its slots from now on and free ours.
            tree = self.cache.match(sequence.namespace, token_ids[:keep_from] + [0], dry_run=True)
            duplicates = sequence.slot_table[known:keep_from].clone()
            sequence.slot_table[known:keep_from] = tree.slots[known:keep_from]
            self.allocator.free(duplicates)
        # [keep_from, keep_to) now belongs to the tree; the unaligned tail stays this request's own.
        self.cache.lock(result.node)
        self.cache.unlock(sequence.locked_node)
        sequence.locked_node = result.node
        sequence.num_tree_slots = keep_to

    def release(self, sequence: Sequence) -> None:
        """Drop the request's lock on the tree and free the slots it holds outside it."""
        started = time.perf_counter()
        with self.tree_lock:
            self.cache.unlock(sequence.locked_node)
            self.allocator.free(sequence.own_slots.clone())
        sequence.locked_node = None
        sequence.num_slots = sequence.num_tree_slots
        sequence.bookkeeping_s += time.perf_counter() - started

    def num_slots_outside_tree(self, sequences) -> int:
        return sum(s.num_slots - s.num_tree_slots for s in sequences)
