"""Keying the prompt-derived hashes a record stores, so that the database alone reveals nothing about prompts.

A plain 64-bit hash of a system prompt can be inverted by guessing: a 4-digit code inside a prompt falls to ten
thousand tries. So every stored hash of prompt material (`prefix_hash`, the block hash chain) is keyed:

- each tenant's record key is HMAC-SHA256(server secret, "prefixscope/record-hash/v1" NUL tenant) (RFC 2104);
- `prefix_hash` is BLAKE2b-64 of the canonical prefix in keyed mode (RFC 7693 section 2.9) under that key;
- each chain hash h becomes the top 63 bits of keyed BLAKE2b-64 of h's 8 little-endian bytes, which keeps equality
  (equal blocks still have equal hashes for the simulator) and the non-negative int64 range.

Two gateways with different secrets store different hashes for the same prompt, and one tenant's hashes cannot be
compared with another's. `KEY_VERSION` is stored with each row (`requests.hash_key_version`); rows from before
keying have NULL there and keep their plain hashes.
"""

from __future__ import annotations

import hashlib
import hmac

from db.chains import RequestChain

KEY_VERSION = 1
_CONTEXT = b"prefixscope/record-hash/v1\x00"
# The fleet key keys the advisor's prompt signatures (`gateway.advisor.signature`): one key for every tenant, so the
# fleet patterns can find the same block across tenants.
_FLEET_CONTEXT = b"prefixscope/fleet-patterns/v1"
_MAX_CACHED_TENANTS = 100_000
# Keyed chain hashes remembered, over all tenants (about 100 bytes each): requests that share a prefix share its
# blocks, so most of a chain was keyed before. Past the bound the memory starts afresh.
_MAX_KEYED_BLOCKS = 131_072


class RecordHasher:
    """Derives and memoizes per-tenant record keys (one HMAC per tenant per process, not per request)."""

    def __init__(self, server_secret: str) -> None:
        if not server_secret:
            raise ValueError("the server secret must not be empty")
        self._secret = server_secret.encode("utf-8")
        self._keys: dict[str, bytes] = {}
        self._chain_hashes: dict[str, hashlib.blake2b] = {}  # per tenant: BLAKE2b-64 keyed with its record key
        self._keyed_blocks: dict[str, dict[int, int]] = {}  # per tenant: chain hash -> keyed hash
        self._num_keyed_blocks = 0

    def key_for(self, tenant: str) -> bytes:
        """The tenant's 32-byte record key."""
        key = self._keys.get(tenant)
        if key is None:
            key = hmac.new(self._secret, _CONTEXT + tenant.encode("utf-8"), hashlib.sha256).digest()
            if len(self._keys) < _MAX_CACHED_TENANTS:
                self._keys[tenant] = key
        return key

    def fleet_key(self) -> bytes:
        """The 32-byte fleet key: HMAC-SHA256(server secret, "prefixscope/fleet-patterns/v1")."""
        return hmac.new(self._secret, _FLEET_CONTEXT, hashlib.sha256).digest()

    def chain(self, tenant: str, chain: RequestChain | None) -> RequestChain | None:
        """`chain` with every hash keyed for `tenant` (None stays None)."""
        if chain is None or not chain.hash_ids:
            return chain
        keyed_hash = self._chain_hashes.get(tenant)
        if keyed_hash is None:
            keyed_hash = hashlib.blake2b(digest_size=8, key=self.key_for(tenant))
            if len(self._chain_hashes) < _MAX_CACHED_TENANTS:
                self._chain_hashes[tenant] = keyed_hash
        known = self._keyed_blocks.get(tenant)
        if known is None:
            known = self._keyed_blocks[tenant] = {}
        keyed = []
        for h in chain.hash_ids:
            value = known.get(h)
            if value is None:
                one = keyed_hash.copy()  # a copy of the keyed state: cheaper than keying a new hash per block
                one.update(h.to_bytes(8, "little", signed=True))
                value = int.from_bytes(one.digest(), "big") >> 1
                if self._num_keyed_blocks >= _MAX_KEYED_BLOCKS:
                    self._keyed_blocks = {tenant: {}}
                    self._num_keyed_blocks = 0
                    known = self._keyed_blocks[tenant]
                known[h] = value
                self._num_keyed_blocks += 1
            keyed.append(value)
        return RequestChain(chain.block_size, chain.input_length, tuple(keyed), chain.approximate)
