"""API keys: creation (the plaintext is returned once), revocation, and verification against hashes in memory.

A key reads `psk-<key_id>-<secret>`. `key_id` (12 hex characters) is public: it names the key in logs, records and
`prefixscope keys list`. Only a hash of the secret (256 random bits) is stored. The secret is high-entropy, so a
single SHA-256 is enough (slow password hashes defend guessable passwords, which these are not) and keeps
verification cheap on every request. The gateway loads `KeyEntry`s with `load_active_keys` and verifies in memory.

Store functions take a sync `Engine`, `Connection` or `Session`; the `*_async` variants take the async ones.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection, insert, select, update

from db.engine import run_in_transaction, run_in_transaction_async
from db.models import ApiKey, Tenant, table_of
from db.tenants import AsyncBind, SyncBind, ensure_tenant
from db.timeutil import utc_now

KEY_PREFIX: Final = "psk-"
_HASH_SCHEME: Final = "sha256$"
_KEY_ID_BYTES: Final = 6
_SECRET_BYTES: Final = 32

KEYS = table_of(ApiKey)
TENANTS = table_of(Tenant)


@dataclass(frozen=True)
class CreatedKey:
    """A newly created key. `plaintext_key` is not stored anywhere: show it once."""

    key_id: str
    plaintext_key: str
    tenant: str
    is_admin: bool


@dataclass(frozen=True)
class KeyEntry:
    """What the gateway keeps in memory to authenticate a request."""

    key_id: str
    tenant: str
    is_admin: bool
    secret_hash: str


@dataclass(frozen=True)
class KeyInfo:
    """A key as listed to an operator (no secret material)."""

    key_id: str
    tenant: str
    is_admin: bool
    label: str | None
    created_at: datetime
    revoked_at: datetime | None


def hash_secret(secret: str) -> str:
    """The stored form of a key's secret part: `sha256$<hex digest>`."""
    return _HASH_SCHEME + hashlib.sha256(secret.encode("utf-8")).hexdigest()


def parse_key(plaintext: str) -> tuple[str, str] | None:
    """`(key_id, secret)` of a well-formed key, or None."""
    if not plaintext.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = plaintext[len(KEY_PREFIX) :].partition("-")
    if not sep or not key_id or not secret:
        return None
    return key_id, secret


def key_id_of(text: str) -> str:
    """The key id named by `text`: a whole key (`psk-<key_id>-<secret>`), `psk-<key_id>`, or the bare key id."""
    text = text.strip()
    parsed = parse_key(text)
    if parsed is not None:
        return parsed[0]
    return text[len(KEY_PREFIX) :] if text.startswith(KEY_PREFIX) else text


def verify_key(plaintext: str, entries: Iterable[KeyEntry] | Mapping[str, KeyEntry]) -> KeyEntry | None:
    """The active entry matching `plaintext`, or None.

    `entries` is what `load_active_keys` returned, or a `{key_id: entry}` mapping (`index_keys`) for O(1) lookup.
    Hashes are compared in constant time.
    """
    parsed = parse_key(plaintext.strip())
    if parsed is None:
        return None
    key_id, secret = parsed
    if isinstance(entries, Mapping):
        entry = entries.get(key_id)
    else:
        entry = next((candidate for candidate in entries if candidate.key_id == key_id), None)
    if entry is None:
        return None
    if hmac.compare_digest(hash_secret(secret).encode("ascii"), entry.secret_hash.encode("ascii")):
        return entry
    return None


def index_keys(entries: Iterable[KeyEntry]) -> dict[str, KeyEntry]:
    """`{key_id: entry}` for `verify_key`."""
    return {entry.key_id: entry for entry in entries}


def _create(conn: Connection, tenant: str, is_admin: bool, label: str | None) -> CreatedKey:
    tenant_info = ensure_tenant(conn, tenant)
    key_id = secrets.token_hex(_KEY_ID_BYTES)
    secret = secrets.token_urlsafe(_SECRET_BYTES)
    conn.execute(
        insert(KEYS).values(
            key_id=key_id,
            tenant_id=tenant_info.id,
            secret_hash=hash_secret(secret),
            is_admin=is_admin,
            label=label,
            created_at=utc_now(),
        )
    )
    return CreatedKey(
        key_id=key_id, plaintext_key=f"{KEY_PREFIX}{key_id}-{secret}", tenant=tenant_info.name, is_admin=is_admin
    )


def _revoke(conn: Connection, key_id: str) -> bool:
    stmt = update(KEYS).where(KEYS.c.key_id == key_id, KEYS.c.revoked_at.is_(None)).values(revoked_at=utc_now())
    return conn.execute(stmt).rowcount > 0


def _key_select() -> Any:
    return select(
        KEYS.c.key_id,
        TENANTS.c.name.label("tenant"),
        KEYS.c.is_admin,
        KEYS.c.secret_hash,
        KEYS.c.label,
        KEYS.c.created_at,
        KEYS.c.revoked_at,
    ).join_from(KEYS, TENANTS, KEYS.c.tenant_id == TENANTS.c.id)


def _load_active(conn: Connection) -> list[KeyEntry]:
    rows = conn.execute(_key_select().where(KEYS.c.revoked_at.is_(None)).order_by(KEYS.c.id))
    return [KeyEntry(row.key_id, row.tenant, bool(row.is_admin), row.secret_hash) for row in rows]


def _load_revoked(conn: Connection) -> list[KeyEntry]:
    rows = conn.execute(_key_select().where(KEYS.c.revoked_at.is_not(None)).order_by(KEYS.c.id))
    return [KeyEntry(row.key_id, row.tenant, bool(row.is_admin), row.secret_hash) for row in rows]


def _list(conn: Connection, include_revoked: bool) -> list[KeyInfo]:
    stmt = _key_select().order_by(TENANTS.c.name, KEYS.c.created_at, KEYS.c.id)
    if not include_revoked:
        stmt = stmt.where(KEYS.c.revoked_at.is_(None))
    return [
        KeyInfo(row.key_id, row.tenant, bool(row.is_admin), row.label, row.created_at, row.revoked_at)
        for row in conn.execute(stmt)
    ]


def create_api_key(bind: SyncBind, tenant: str, is_admin: bool = False, label: str | None = None) -> CreatedKey:
    """Create a key for `tenant` (created too if new). The plaintext is in the result and nowhere else."""
    return run_in_transaction(bind, _create, tenant, is_admin, label)


def revoke_api_key(bind: SyncBind, key_id: str) -> bool:
    """Revoke a key; False if there is no active key with that id."""
    return run_in_transaction(bind, _revoke, key_id)


def load_active_keys(bind: SyncBind) -> list[KeyEntry]:
    """Every unrevoked key, for the gateway's in-memory key table."""
    return run_in_transaction(bind, _load_active)


def list_api_keys(bind: SyncBind, include_revoked: bool = True) -> list[KeyInfo]:
    """Keys by tenant and creation time, for operators."""
    return run_in_transaction(bind, _list, include_revoked)


async def create_api_key_async(
    bind: AsyncBind, tenant: str, is_admin: bool = False, label: str | None = None
) -> CreatedKey:
    """`create_api_key` on an async engine, connection or session."""
    return await run_in_transaction_async(bind, _create, tenant, is_admin, label)


async def revoke_api_key_async(bind: AsyncBind, key_id: str) -> bool:
    """`revoke_api_key` on an async engine, connection or session."""
    return await run_in_transaction_async(bind, _revoke, key_id)


async def load_active_keys_async(bind: AsyncBind) -> list[KeyEntry]:
    """`load_active_keys` on an async engine, connection or session."""
    return await run_in_transaction_async(bind, _load_active)


async def load_revoked_keys_async(bind: AsyncBind) -> list[KeyEntry]:
    """Every revoked key, so the gateway can say a key was revoked rather than unknown."""
    return await run_in_transaction_async(bind, _load_revoked)


async def list_api_keys_async(bind: AsyncBind, include_revoked: bool = True) -> list[KeyInfo]:
    """`list_api_keys` on an async engine, connection or session."""
    return await run_in_transaction_async(bind, _list, include_revoked)
