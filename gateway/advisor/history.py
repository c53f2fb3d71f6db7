"""Each tenant's recent answered requests, as the advisor needs them: the request as the client sent it, as the
upstream got it, and (computed when first needed, then kept) as each candidate would have rewritten it.

A rendering carries the prompt's segment keys: chained hashes over the model, the tools (as serialised, key order
included) and each message (or the completion prompt). Two prompts share their first `n` keys exactly when their
first `n` segments are byte-identical, which is how the advisor finds the earlier request a rewritten prompt would
have matched longest. The history itself is changed on the event loop only; an entry's renderings are computed in the
advisor's worker threads (two threads computing the same one just do it twice, each storing an equal value).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.parsing import CHAT

_ENCODER = msgspec.json.Encoder()
CURRENT = ""  # the memo key of the request as the upstream got it
DEFAULT_HISTORY_SIZE = 256


def _digest(value: Any) -> int:
    try:
        return hash(_ENCODER.encode(value))
    except (TypeError, ValueError, msgspec.EncodeError):
        return hash(repr(value))


def segment_keys(endpoint: str, request: dict[str, Any]) -> tuple[int, ...]:
    """Chained hashes over the prompt's segments: model, then tools and each message (chat) or the prompt."""
    digests = [_digest(request.get("model"))]
    if endpoint == CHAT:
        digests.append(_digest(request.get("tools")))
        messages = request.get("messages")
        digests.extend(_digest(message) for message in (messages if isinstance(messages, list) else ()))
    else:
        digests.append(_digest(request.get("prompt")))
    keys = []
    key = 0
    for digest in digests:
        key = hash((key, digest))
        keys.append(key)
    return tuple(keys)


def shared_segments(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading segment keys two renderings share."""
    count = 0
    for left, right in zip(a, b, strict=False):
        if left != right:
            break
        count += 1
    return count


@dataclass(frozen=True, slots=True)
class Rendering:
    """A prompt as one set of rules would send it, with its segment keys."""

    request: dict[str, Any]
    keys: tuple[int, ...]


@dataclass(slots=True, eq=False)
class Entry:
    """One remembered request: as the client sent it (`raw_body`) and as the upstream got it (`body`)."""

    endpoint: str
    raw_body: dict[str, Any]
    body: dict[str, Any]
    renderings: dict[str, Rendering] = field(default_factory=dict)

    def rendering(self, key: str, rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None) -> Rendering:
        """The request as candidate `key` would have sent it (`CURRENT`: as it was sent), computed once."""
        found = self.renderings.get(key)
        if found is None:
            request = self.body if rewrite is None else rewrite(self.raw_body)
            found = self.renderings[key] = Rendering(request, segment_keys(self.endpoint, request))
        return found


class TenantAdviceHistory:
    """The last `capacity` answered requests of one tenant, oldest first."""

    def __init__(self, capacity: int = DEFAULT_HISTORY_SIZE) -> None:
        self._entries: deque[Entry] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._entries)

    def snapshot(self) -> tuple[Entry, ...]:
        return tuple(self._entries)

    def add(self, entry: Entry) -> None:
        self._entries.append(entry)


class AdviceHistories:
    """Every tenant's history."""

    def __init__(self, capacity: int = DEFAULT_HISTORY_SIZE) -> None:
        self.capacity = capacity
        self._tenants: dict[str, TenantAdviceHistory] = {}

    def for_tenant(self, tenant: str) -> TenantAdviceHistory:
        history = self._tenants.get(tenant)
        if history is None:
            history = self._tenants[tenant] = TenantAdviceHistory(self.capacity)
        return history
