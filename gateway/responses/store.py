"""What the gateway keeps of a stored response (`store` true): enough to continue it (`previous_response_id`) and to
answer `GET /v1/responses/{id}`, per tenant, bounded and expiring.

Entries are found by a keyed hash of the response id under the tenant's own key (`gateway.record_keys`), so a lookup
with another tenant's key finds nothing, whatever id it names: one tenant can neither read nor continue nor delete
another's response. Bounds: a lifetime since last use (`store_ttl_s`), a count per tenant and in all, and the
stored JSON's bytes in all; the least recently used entries go first. Memory only: nothing here reaches the database.

An entry of a chat upstream keeps the Response object and the conversation as chat messages (without the
instructions, which a later turn does not inherit). An entry of an OpenAI upstream keeps only which upstream holds
the response: the upstream keeps the conversation itself, and the gateway only checks that the id is the tenant's.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.config.responses import ResponsesSettings

_ENCODER = msgspec.json.Encoder()
_ENTRY_OVERHEAD_BYTES = 256


@dataclass(slots=True)
class StoredResponse:
    """One kept response: its tenant, the upstream that answered, the Response object and the conversation so far
    as chat messages (None and empty for an OpenAI upstream, which keeps both itself)."""

    tenant: str
    upstream: str
    response: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    size_bytes: int = 0
    last_used: float = 0.0


class ResponseStore:
    """A bounded, expiring map (tenant, response id) -> `StoredResponse`. Not thread-safe (the event loop's only)."""

    def __init__(
        self,
        settings: ResponsesSettings,
        tenant_key: Callable[[str], bytes],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._tenant_key = tenant_key
        self._clock = clock
        self._entries: OrderedDict[bytes, StoredResponse] = OrderedDict()
        self._per_tenant: dict[str, int] = {}
        self._bytes = 0

    def _key(self, tenant: str, response_id: str) -> bytes:
        return hashlib.blake2b(response_id.encode("utf-8"), digest_size=16, key=self._tenant_key(tenant)).digest()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def put(self, tenant: str, response_id: str, entry: StoredResponse) -> None:
        """Keep `entry` under the tenant's `response_id` (replacing one already there), then trim to the bounds."""
        key = self._key(tenant, response_id)
        self._remove(key)
        entry.size_bytes = _ENTRY_OVERHEAD_BYTES + len(_ENCODER.encode([entry.response, entry.history]))
        entry.last_used = self._clock()
        self._entries[key] = entry
        self._per_tenant[tenant] = self._per_tenant.get(tenant, 0) + 1
        self._bytes += entry.size_bytes
        self._trim(tenant)

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The tenant's entry for `response_id`, None when unknown, expired or another tenant's."""
        self._expire()
        key = self._key(tenant, response_id)
        entry = self._entries.get(key)
        if entry is None or entry.tenant != tenant:
            return None
        entry.last_used = self._clock()
        self._entries.move_to_end(key)
        return entry

    def delete(self, tenant: str, response_id: str) -> bool:
        """Forget the tenant's `response_id`; whether there was one."""
        return self._remove(self._key(tenant, response_id)) is not None

    def _remove(self, key: bytes) -> StoredResponse | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size_bytes
            remaining = self._per_tenant[entry.tenant] - 1
            if remaining:
                self._per_tenant[entry.tenant] = remaining
            else:
                del self._per_tenant[entry.tenant]
        return entry

    def _expire(self) -> None:
        deadline = self._clock() - self._settings.store_ttl_s
        while self._entries:
            key, oldest = next(iter(self._entries.items()))
            if oldest.last_used > deadline:
                return
            self._remove(key)

    def _trim(self, tenant: str) -> None:
        self._expire()
        settings = self._settings
        if self._per_tenant.get(tenant, 0) > settings.store_max_entries_per_tenant:
            oldest = next(key for key, entry in self._entries.items() if entry.tenant == tenant)
            self._remove(oldest)
        while self._entries and (
            len(self._entries) > settings.store_max_entries or self._bytes > settings.store_max_bytes
        ):
            self._remove(next(iter(self._entries)))
