"""API keys and tenants: keys are shown once, stored hashed, verified in memory in constant time."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from db.engine import create_async_engine_for, create_sync_engine_for
from db.errors import UnknownTenantError
from db.keys import (
    KEY_PREFIX,
    create_api_key,
    create_api_key_async,
    hash_secret,
    index_keys,
    list_api_keys,
    load_active_keys,
    load_active_keys_async,
    parse_key,
    revoke_api_key,
    revoke_api_key_async,
    verify_key,
)
from db.tenants import ensure_tenant, ensure_tenant_async, get_tenant, load_tenants, set_tenant_settings


def test_create_verify_revoke(db_url: str) -> None:
    engine = create_sync_engine_for(db_url)
    try:
        created = create_api_key(engine, "acme", is_admin=True, label="ops")
        assert created.plaintext_key.startswith(f"{KEY_PREFIX}{created.key_id}-")
        assert (created.tenant, created.is_admin) == ("acme", True)
        other = create_api_key(engine, "globex")

        entries = load_active_keys(engine)
        assert {entry.key_id for entry in entries} == {created.key_id, other.key_id}
        for table in (entries, index_keys(entries)):
            match = verify_key(created.plaintext_key, table)
            assert match is not None and (match.tenant, match.is_admin) == ("acme", True)
            assert verify_key(other.plaintext_key, table).tenant == "globex"  # type: ignore[union-attr]
            assert verify_key(created.plaintext_key[:-1] + "x", table) is None  # wrong secret
            assert verify_key(f"{KEY_PREFIX}{created.key_id}", table) is None  # no secret at all
            assert verify_key("sk-not-ours", table) is None

        assert revoke_api_key(engine, created.key_id) is True
        assert revoke_api_key(engine, created.key_id) is False  # already revoked
        assert revoke_api_key(engine, "nope") is False
        active = load_active_keys(engine)
        assert verify_key(created.plaintext_key, active) is None
        assert verify_key(other.plaintext_key, active) is not None
        listed = {item.key_id: item for item in list_api_keys(engine)}
        assert listed[created.key_id].revoked_at is not None and listed[created.key_id].label == "ops"
        assert [item.key_id for item in list_api_keys(engine, include_revoked=False)] == [other.key_id]
    finally:
        engine.dispose()


def test_plaintext_is_never_stored(db_url: str) -> None:
    engine = create_sync_engine_for(db_url)
    try:
        created = create_api_key(engine, "acme")
        _, secret = parse_key(created.plaintext_key)  # type: ignore[misc]
        with engine.connect() as conn:
            stored = [
                str(value)
                for table in ("api_keys", "tenants")
                for row in conn.execute(text(f"SELECT * FROM {table}"))
                for value in row
            ]
        assert not any(secret in value or created.plaintext_key in value for value in stored)
        assert hash_secret(secret) in stored
    finally:
        engine.dispose()


def test_keys_are_unique_and_random(db_url: str) -> None:
    engine = create_sync_engine_for(db_url)
    try:
        keys = [create_api_key(engine, "acme") for _ in range(5)]
        assert len({key.key_id for key in keys}) == 5
        assert len({key.plaintext_key for key in keys}) == 5
    finally:
        engine.dispose()


def test_tenants_are_created_once_and_keep_settings(db_url: str) -> None:
    engine = create_sync_engine_for(db_url)
    try:
        first = ensure_tenant(engine, "acme", {"store_prompts": True})
        again = ensure_tenant(engine, " acme ", {"store_prompts": False})
        assert again.id == first.id and again.settings == {"store_prompts": True}
        updated = set_tenant_settings(engine, "acme", {"store_prompts": False, "rules": ["hoist"]})
        assert updated.settings == {"store_prompts": False, "rules": ["hoist"]}
        assert get_tenant(engine, "acme") == updated
        assert get_tenant(engine, "nobody") is None
        with pytest.raises(UnknownTenantError):
            set_tenant_settings(engine, "nobody", {})
        with pytest.raises(ValueError):
            ensure_tenant(engine, "   ")
        create_api_key(engine, "globex")  # creates its tenant
        assert [tenant.name for tenant in load_tenants(engine)] == ["acme", "globex"]
        assert first.created_at.tzinfo is not None
    finally:
        engine.dispose()


async def test_async_variants(db_url: str) -> None:
    engine = create_async_engine_for(db_url)
    try:
        tenant = await ensure_tenant_async(engine, "acme")
        created = await create_api_key_async(engine, tenant.name, label="gateway")
        entries = await load_active_keys_async(engine)
        assert verify_key(created.plaintext_key, index_keys(entries)) is not None
        async with engine.begin() as conn:  # an AsyncConnection works too, inside the caller's transaction
            assert await revoke_api_key_async(conn, created.key_id) is True
        assert await load_active_keys_async(engine) == []
    finally:
        await engine.dispose()
