"""A bounded memory of the prefixes each namespace has computed, by keyed hash only, to say how much of a prompt an
earlier request had already sent and computed (`seen_tokens`), whether or not its KV is still cached.

Each computed sequence is remembered as the hashes of its page prefixes (`ghost_index.prefix_hash` of the tokens up to
every page boundary) and, under each of them, up to `CONTINUATIONS` fingerprints of what followed within the next page
(16 bits per token, keyed by the process's hash secret and the prefix's hash). `seen_tokens` walks the prompt page by
page, then token by token inside the first page no earlier sequence shared: a 12-token shared opening with 16-token
pages is 12 seen tokens. No token ids are kept; the least recently used prefixes are forgotten first.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

# How many different continuations (the tokens after a prefix, up to the next page boundary) are kept per prefix.
CONTINUATIONS = 4
# The shortest page the index hashes by, whatever the cache's page: a digest per token (pages of one token) took
# 2.8 ms to remember a 1.8k-token prompt, a quarter of a bf16 decode step's time per request on a 2-core EPYC. The
# fingerprints keep the answer token-precise either way.
MIN_PAGE_TOKENS = 16


def _fingerprint(key: bytes, tokens: list[int]) -> bytes:
    """16 bits per token, keyed by the prefix hash (and the process's hash secret through `hash`)."""
    return array("H", (hash((key, position, token)) & 0xFFFF for position, token in enumerate(tokens))).tobytes()


def _shared_prefix(a: bytes, b: bytes) -> int:
    """Tokens (2 bytes each) two fingerprints share from the start."""
    count = 0
    for position in range(0, min(len(a), len(b)) - 1, 2):
        if a[position : position + 2] != b[position : position + 2]:
            break
        count += 1
    return count


class SeenIndex:
    """Page prefixes computed per namespace (see the module docstring); at most `capacity` prefixes are kept, of
    pages of `page_size` tokens or MIN_PAGE_TOKENS, whichever is longer."""

    def __init__(self, capacity: int, page_size: int) -> None:
        self.capacity = capacity
        self.page_size = max(page_size, MIN_PAGE_TOKENS)
        self._entries: OrderedDict[bytes, list[bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _keys(self, namespace: str, token_ids: list[int], stop: int):
        """(page start, hash of the tokens before it) for each page start up to `stop`, the empty prefix first."""
        digest = hashlib.blake2b(namespace.encode(), digest_size=16)
        yield 0, digest.copy().digest()
        for start in range(0, stop - self.page_size + 1, self.page_size):
            digest.update(array("i", token_ids[start : start + self.page_size]).tobytes())
            yield start + self.page_size, digest.copy().digest()

    def remember(self, namespace: str, token_ids: list[int]) -> None:
        """Remember that `token_ids` were computed in `namespace`."""
        if self.capacity <= 0 or not token_ids:
            return
        keys = list(self._keys(namespace, token_ids, len(token_ids)))
        for position, (start, key) in enumerate(keys):
            if position + 1 < len(keys) and keys[position + 1][1] in self._entries:
                self._entries.move_to_end(key)  # this page was remembered whole before: its fingerprint is kept
                continue
            following = token_ids[start : start + self.page_size]
            self._add(key, _fingerprint(key, following) if following else b"")

    def _add(self, key: bytes, continuation: bytes) -> None:
        known = self._entries.get(key)
        if known is None:
            known = self._entries[key] = []
        else:
            self._entries.move_to_end(key)
        if continuation and not any(other.startswith(continuation) for other in known):
            known[:] = [other for other in known if not continuation.startswith(other)]
            known.insert(0, continuation)
            del known[CONTINUATIONS:]
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def seen_tokens(self, namespace: str, token_ids: list[int], at_least: int = 0) -> int:
        """The longest prefix of `token_ids` (in tokens, at most all of them) an earlier remembered sequence in
        `namespace` shared; at least `at_least` (what is cached now was computed before)."""
        if self.capacity <= 0:
            return min(at_least, len(token_ids))
        seen = 0
        keys = list(self._keys(namespace, token_ids, len(token_ids)))
        for position, (start, key) in enumerate(keys):
            known = self._entries.get(key)
            if known is None:
                break
            seen = start
            if position + 1 < len(keys) and keys[position + 1][1] in self._entries:
                continue  # the whole page was computed before: the next prefix's hash is known
            following = token_ids[start : start + self.page_size]
            mine = _fingerprint(key, following)
            seen = start + max((_shared_prefix(mine, other) for other in known), default=0)
            break
        return max(seen, min(at_least, len(token_ids)))

    def clear(self) -> None:
        self._entries.clear()
