"""The tool-call arguments the gateway returned, by their JSON value, so a re-sent call can be written as returned.

An agent re-sends each tool call of the previous answer. The upstream cached that answer as it wrote it: the same
arguments in other text (keys in another order, other spacing, `\\u00e9` for `é`) miss from that point on. Per
tenant, in memory only, this remembers each returned call under a digest of its function name and its arguments'
JSON value (BLAKE2b keyed with the tenant's record key) with the text as returned, so that the
`tool_call_arguments_key_order` rule (`gateway.normalize.rules`) can put a re-serialised call back as it was returned,
and leaves a call re-sent as returned exactly as it is.

Bounded: at most `max_entries` calls and `max_chars` argument characters in all (oldest forgotten first), each
forgotten at the time its turn is (`expires_at`, the tenant's longest retention class after the answer).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from gateway.conversations.answer import ToolCall

# Texts kept per (name, value): a value returned in two spellings (by two upstreams) keeps both, so a re-send of
# either is left as it is.
_SPELLINGS = 4


def canonical_value(arguments: str) -> str | None:
    """`arguments` as canonical JSON (sorted keys, compact, non-ASCII kept), or None when it is not JSON."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):
        return None


class ReturnedCalls:
    """Remembered tool calls: `remember` after an answer went to the client, `as_returned` when a call is re-sent.
    `key_for(tenant)` gives the tenant's record key (bytes). Not thread-safe: used from the event loop only. Raises
    ValueError for a bound below 1."""

    def __init__(
        self,
        key_for: Callable[[str], bytes],
        *,
        max_entries: int = 200_000,
        max_chars: int = 20_000_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min(max_entries, max_chars) < 1:
            raise ValueError("the returned-call memory bounds must be positive")
        self._key_for = key_for
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._clock = clock
        # (tenant, digest) -> (spellings as returned, newest last; expiry on the clock)
        self._calls: OrderedDict[tuple[str, bytes], tuple[tuple[str, ...], float]] = OrderedDict()
        self.chars = 0

    def __len__(self) -> int:
        return len(self._calls)

    def remember(self, tenant: str, calls: Iterable[ToolCall], expires_at: float) -> None:
        """Remember the tool calls of an answer the tenant was given, until `expires_at` (on the clock)."""
        for call in calls:
            canonical = canonical_value(call.arguments)
            if canonical is None or len(call.arguments) > self.max_chars:
                continue
            slot = (tenant, self._digest(tenant, call.name, canonical))
            spellings, _ = self._calls.pop(slot, ((), 0.0))
            self.chars -= sum(map(len, spellings))
            spellings = (*(s for s in spellings if s != call.arguments), call.arguments)[-_SPELLINGS:]
            self._calls[slot] = (spellings, expires_at)
            self.chars += sum(map(len, spellings))
        while len(self._calls) > self.max_entries or self.chars > self.max_chars:
            self._drop_oldest()

    def as_returned(self, tenant: str, name: Any, arguments: Any) -> str | None:
        """The arguments text the gateway returned for a call of `name` with the same JSON value as `arguments`
        (the text re-sent), when it differs from `arguments`; None when `arguments` is a text as returned, or no such
        call was returned (or it was forgotten), or either is not a string."""
        if not isinstance(name, str) or not isinstance(arguments, str) or not self._calls:
            return None
        canonical = canonical_value(arguments)
        if canonical is None:
            return None
        slot = (tenant, self._digest(tenant, name, canonical))
        held = self._calls.get(slot)
        if held is None:
            return None
        spellings, expires_at = held
        if expires_at <= self._clock():
            del self._calls[slot]
            self.chars -= sum(map(len, spellings))
            return None
        return None if arguments in spellings else spellings[-1]

    def lookup_for(self, tenant: str) -> Callable[[str, str], str | None]:
        """`as_returned` bound to one tenant (what a tenant's normalization pipeline is given)."""
        return lambda name, arguments: self.as_returned(tenant, name, arguments)

    def _digest(self, tenant: str, name: str, canonical: str) -> bytes:
        data = name.encode("utf-8", "surrogatepass") + b"\x00" + canonical.encode("utf-8", "surrogatepass")
        return hashlib.blake2b(data, key=self._key_for(tenant), digest_size=16).digest()

    def _drop_oldest(self) -> None:
        _, (spellings, _) = self._calls.popitem(last=False)
        self.chars -= sum(map(len, spellings))
