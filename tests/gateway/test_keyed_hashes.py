"""Stored prompt hashes are keyed: the same prompt under two servers' secrets (or two tenants) stores different
prefix hashes and hash chains, while one tenant's equal prompts still share them (the simulator needs equality)."""

from __future__ import annotations

import hashlib

import httpx
import msgspec
from gateway_testkit import db_storage, gateway_config, running_gateway, wait_until
from sqlalchemy import create_engine, text

from db.chains import unpack_hash_ids
from db.keys import create_api_key
from db.migrate import upgrade
from gateway.record_keys import RecordHasher

SYSTEM = "You are the ACME returns desk. The door code is 4821. " * 4
CHAT = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}


def stored_hashes(url: str) -> list[tuple[str, str, int | None, tuple[int, ...]]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT r.tenant, r.prefix_hash, r.hash_key_version, c.hash_ids FROM requests r "
                    "JOIN request_chains c ON c.request_id = r.id ORDER BY r.created_at"
                )
            )
            return [(row[0], row[1], row[2], unpack_hash_ids(row[3])) for row in rows]
    finally:
        engine.dispose()


def run_gateway(stub_url: str, tmp_path, secret: str) -> list[tuple[str, str, int | None, tuple[int, ...]]]:
    url = f"sqlite:///{tmp_path}/{secret}.db"
    upgrade(url)
    engine = create_engine(url)
    keys = {tenant: create_api_key(engine, tenant).plaintext_key for tenant in ("acme", "globex")}
    engine.dispose()
    storage = db_storage(url, tmp_path / secret)
    with running_gateway(gateway_config(stub_url, server_secret=secret, auth="keys"), storage) as gw:
        for tenant in ("acme", "acme", "globex"):
            headers = {"authorization": f"Bearer {keys[tenant]}"}
            assert httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
        assert wait_until(lambda: storage.sink.counters().written == 3)
    return stored_hashes(url)


def test_same_prompt_under_two_secrets_stores_different_hashes(stub, stub_url, tmp_path):
    first = run_gateway(stub_url, tmp_path, "secret-one")
    second = run_gateway(stub_url, tmp_path, "secret-two")
    (acme1, acme1_again, globex1), (acme2, _, globex2) = first, second
    assert all(row[2] == 1 for row in first + second)
    assert all(row[3] for row in first + second)  # chains were recorded
    # Equal prompts of one tenant under one secret still match (grouping and the simulator rely on it)...
    assert acme1[1] == acme1_again[1] and acme1[3] == acme1_again[3]
    # ...but another secret, or another tenant, gives unrelated hashes.
    assert acme1[1] != acme2[1] and not set(acme1[3]) & set(acme2[3])
    assert acme1[1] != globex1[1] and globex1[1] != globex2[1]
    # The plain, unkeyed hash of the prefix (what a dictionary attack would compute) is stored nowhere.
    material = msgspec.json.Encoder(order="deterministic").encode(["m", None, [SYSTEM]])
    plain = hashlib.blake2b(material, digest_size=8).hexdigest()
    assert plain not in {row[1] for row in first + second}
    keyed = hashlib.blake2b(material, digest_size=8, key=RecordHasher("secret-one").key_for("acme")).hexdigest()
    assert acme1[1] == keyed


def _keyed_block(key: bytes, block_hash: int) -> int:
    """The keyed form of one chain hash, as the module docstring of `gateway.record_keys` defines it."""
    digest = hashlib.blake2b(block_hash.to_bytes(8, "little", signed=True), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "big") >> 1


def test_keyed_chains_stay_the_same_when_blocks_are_remembered_and_forgotten(monkeypatch):
    from db.chains import RequestChain
    from gateway import record_keys

    monkeypatch.setattr(record_keys, "_MAX_KEYED_BLOCKS", 5)  # forget every few blocks
    hasher = RecordHasher("secret-one")
    chains = [RequestChain(16, 64, (1, 2, -3, 4)), RequestChain(16, 96, (1, 2, -3, 4, 5, 2**63 - 1))]
    for tenant in ("acme", "globex", "acme"):
        key = hasher.key_for(tenant)
        for chain in chains:
            keyed = hasher.chain(tenant, chain)
            assert keyed.hash_ids == tuple(_keyed_block(key, h) for h in chain.hash_ids)
            assert (keyed.block_size, keyed.input_length, keyed.approximate) == (16, chain.input_length, False)
