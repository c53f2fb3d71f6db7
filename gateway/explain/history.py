"""Per-tenant memory of recent requests' segments, to find the earlier request a new one is closest to.

Each tenant keeps the segment digests of its last `capacity` answered requests (oldest dropped first) and two
dictionaries from chained prefix hashes to the most recent request with that prefix: one over all segments (model
first) and one that skips the model. The nearest earlier request is the one sharing the longest leading run of
segments; finding it costs one dictionary lookup per segment. The chain without the model finds the same prompt sent
to another model.

Segment texts are kept once per distinct digest (reference-counted by the requests holding them) within a character
budget, so that the first differing character can be found; past the budget a text is not kept and its offset is
unknown.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gateway.explain.segments import PromptSegments

DEFAULT_CAPACITY = 1000
DEFAULT_TEXT_BUDGET_CHARS = 1_000_000
_WITHOUT_MODEL_SEED = 0x5EED


@dataclass(slots=True, eq=False)
class Entry:
    """One remembered request."""

    names: tuple[str, ...]
    kinds: tuple[str, ...]
    digests: tuple[int, ...]
    prefix_keys: tuple[int, ...]  # chained hashes over all segments
    rest_keys: tuple[int, ...]  # chained hashes over the segments after the model
    prompt_tokens: int | None
    text_digests: tuple[int, ...] = ()  # the texts this entry holds a reference to
    request_id: str | None = None  # the gateway's id of the request (its conversation's later turns name it)


@dataclass(frozen=True, slots=True)
class Nearest:
    """The closest earlier request: `shared` leading segments are equal (counted without the model when
    `other_model`, in which case the model is what differs first)."""

    entry: Entry
    shared: int
    other_model: bool


def _chain(digests: Sequence[int], seed: int) -> tuple[int, ...]:
    keys = []
    key = seed
    for digest in digests:
        key = hash((key, digest))
        keys.append(key)
    return tuple(keys)


class TenantHistory:
    """The recent requests of one tenant. Not thread-safe: used from the event loop only."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, text_budget_chars: int = DEFAULT_TEXT_BUDGET_CHARS) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._text_budget_chars = text_budget_chars
        self._entries: deque[Entry] = deque()
        self._by_prefix: dict[int, Entry] = {}
        self._by_rest: dict[int, Entry] = {}
        self._texts: dict[int, list] = {}  # digest -> [text, number of entries holding it]
        self._text_chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def text_chars(self) -> int:
        return self._text_chars

    def text(self, digest: int) -> str | None:
        """A remembered segment text, or None when it was not kept."""
        held = self._texts.get(digest)
        return None if held is None else held[0]

    def nearest(self, prompt: PromptSegments) -> Nearest | None:
        """The earlier request sharing the longest leading run of segments, or None when none shares any (not even
        the model, nor the first segments after it)."""
        digests = prompt.digests
        same_model, same_run = self._longest(_chain(digests, 0), self._by_prefix)
        other, other_run = self._longest(_chain(digests[1:], _WITHOUT_MODEL_SEED), self._by_rest)
        # The same model wins ties: its run includes the model itself.
        if other is not None and (same_model is None or other_run > same_run - 1):
            return Nearest(other, other_run, other_model=other.digests[0] != digests[0])
        if same_model is not None:
            return Nearest(same_model, same_run, other_model=False)
        return None

    @staticmethod
    def _longest(keys: tuple[int, ...], index: dict[int, Entry]) -> tuple[Entry | None, int]:
        found, run = None, 0
        for position, key in enumerate(keys):
            entry = index.get(key)
            if entry is None:
                break
            found, run = entry, position + 1
        return found, run

    def sharing(self, prompt: PromptSegments, num_segments: int) -> Iterator[Entry]:
        """Remembered requests (newest first) whose first `num_segments` segments equal `prompt`'s (model first)."""
        if num_segments < 1:
            return
        key = _chain(prompt.digests[:num_segments], 0)[-1]
        for entry in reversed(self._entries):
            if len(entry.prefix_keys) >= num_segments and entry.prefix_keys[num_segments - 1] == key:
                yield entry

    def add(self, prompt: PromptSegments, prompt_tokens: int | None = None, request_id: str | None = None) -> Entry:
        """Remember a request (the most recent one for each of its prefixes), forgetting the oldest if full."""
        segments = prompt.segments
        digests = prompt.digests
        entry = Entry(
            names=tuple(s.name for s in segments),
            kinds=tuple(s.kind for s in segments),
            digests=digests,
            prefix_keys=_chain(digests, 0),
            rest_keys=_chain(digests[1:], _WITHOUT_MODEL_SEED),
            prompt_tokens=prompt_tokens,
            request_id=request_id,
        )
        if len(self._entries) >= self.capacity:
            self._forget(self._entries.popleft())
        self._entries.append(entry)
        for key in entry.prefix_keys:
            self._by_prefix[key] = entry
        for key in entry.rest_keys:
            self._by_rest[key] = entry
        holding = []
        for segment in {s.digest: s for s in segments}.values():
            held = self._texts.get(segment.digest)
            if held is not None:
                held[1] += 1
            elif self._text_chars + len(segment.text) <= self._text_budget_chars:
                self._texts[segment.digest] = [segment.text, 1]
                self._text_chars += len(segment.text)
            else:
                continue
            holding.append(segment.digest)
        entry.text_digests = tuple(holding)
        return entry

    def _forget(self, entry: Entry) -> None:
        # An index slot points at the most recent entry with that prefix; the oldest entry is only still there
        # when no later request shared the prefix.
        for key in entry.prefix_keys:
            if self._by_prefix.get(key) is entry:
                del self._by_prefix[key]
        for key in entry.rest_keys:
            if self._by_rest.get(key) is entry:
                del self._by_rest[key]
        for digest in entry.text_digests:
            held = self._texts[digest]
            held[1] -= 1
            if held[1] <= 0:
                del self._texts[digest]
                self._text_chars -= len(held[0])


class HistoryIndex:
    """Every tenant's `TenantHistory`, created on first use with that tenant's capacity."""

    def __init__(self, text_budget_chars: int = DEFAULT_TEXT_BUDGET_CHARS) -> None:
        self._tenants: dict[str, TenantHistory] = {}
        self._text_budget_chars = text_budget_chars

    def for_tenant(self, tenant: str, capacity: int) -> TenantHistory:
        history = self._tenants.get(tenant)
        if history is None:
            history = self._tenants[tenant] = TenantHistory(capacity, self._text_budget_chars)
        return history
