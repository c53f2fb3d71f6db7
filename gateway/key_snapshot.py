"""The local key snapshot: the last key table read from the database, kept on disk for a start while it is down.

Only what authentication needs is kept: key ids, tenants, admin flags and the stored hashes of the secrets (never a
plaintext key), plus when the table was read (`loaded_at`, seconds since the epoch), so the staleness bound
(`auth.max_key_staleness_s`) still counts from the last real read after a restart. The file is JSON, replaced
atomically (written beside, fsynced, renamed) and readable by its owner only (mode 0600).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from db.keys import KeyEntry
from gateway.auth import KeySnapshot

FORMAT_VERSION = 1


def _entries(mapping: Any) -> list[dict[str, Any]]:
    entries = mapping.values() if isinstance(mapping, dict) else mapping
    return [
        {"key_id": e.key_id, "tenant": e.tenant, "is_admin": bool(e.is_admin), "secret_hash": e.secret_hash}
        for e in entries
    ]


def _read_entries(items: Any) -> dict[str, KeyEntry]:
    return {
        item["key_id"]: KeyEntry(str(item["key_id"]), str(item["tenant"]), bool(item["is_admin"]),
                                 str(item["secret_hash"]))
        for item in items
    }


def write_key_snapshot(path: Path, snapshot: KeySnapshot) -> None:
    """Replace the file at `path` with `snapshot` (entries are `db.keys.KeyEntry`s). Raises OSError."""
    document = {
        "format": FORMAT_VERSION,
        "loaded_at": snapshot.loaded_at,
        "any_key_exists": snapshot.any_key_exists,
        "keys": _entries(snapshot.entries),
        "revoked": _entries(snapshot.revoked),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(document, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def read_key_snapshot(path: Path) -> KeySnapshot | None:
    """The snapshot saved at `path`, or None when there is none or it cannot be read or parsed."""
    try:
        document: Any = json.loads(path.read_text(encoding="utf-8"))
        if document.get("format") != FORMAT_VERSION:
            return None
        return KeySnapshot(
            entries=_read_entries(document["keys"]),
            any_key_exists=bool(document["any_key_exists"]),
            loaded_at=float(document["loaded_at"]),
            revoked=_read_entries(document.get("revoked", ())),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
