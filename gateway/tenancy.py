"""Tenant isolation: the server secret and each tenant's cache salt.

The salt is HMAC-SHA256(server_secret, tenant) in hex. It is derived on the server, so a client can neither pick
another tenant's namespace nor learn its own salt; engines that namespace their prefix cache by salt (the local
engine, vLLM, SGLang) then never let one tenant's request match another tenant's cached prefix.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from gateway.errors import ConfigError

log = logging.getLogger(__name__)

_SECRET_BYTES = 32


def derive_salt(server_secret: str, tenant: str) -> str:
    """HMAC-SHA256(server_secret, tenant), hex encoded."""
    return hmac.new(server_secret.encode("utf-8"), tenant.encode("utf-8"), hashlib.sha256).hexdigest()


def namespace_label(salt: str) -> str:
    """The label an engine shows for the cache namespace of `salt` (the local engine's `/v1/cache/tree`): the first
    12 hex digits of SHA-256(salt). Recorded with each request so the dashboard can name a namespace's tenant from the
    database, without ever asking the engine (which never sees tenant names)."""
    return hashlib.sha256(salt.encode()).hexdigest()[:12] if salt else "default"


class SaltDeriver:
    """Derives and memoizes tenants' salts (one HMAC per tenant per process, not per request)."""

    def __init__(self, server_secret: str) -> None:
        if not server_secret:
            raise ConfigError("the server secret must not be empty")
        self._secret = server_secret
        self._cache: dict[str, str] = {}
        self._labels: dict[str, str] = {}

    def salt_for(self, tenant: str) -> str:
        salt = self._cache.get(tenant)
        if salt is None:
            salt = derive_salt(self._secret, tenant)
            if len(self._cache) < 100_000:
                self._cache[tenant] = salt
        return salt

    def label_for(self, tenant: str) -> str:
        """`namespace_label` of the tenant's salt (memoized like the salt)."""
        label = self._labels.get(tenant)
        if label is None:
            label = namespace_label(self.salt_for(tenant))
            if len(self._labels) < 100_000:
                self._labels[tenant] = label
        return label


def load_or_create_secret(path: Path) -> str:
    """Read the server secret from `path`, creating it (random, mode 0600) on first use.

    Keeping it in a file makes the salts, and so the engines' cached prefixes, survive gateway restarts.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise ConfigError(f"cannot read the server secret file {path}: {exc}") from exc
    if text:
        if path.stat().st_mode & 0o077:
            log.warning("server secret file %s is readable by others; setting its mode to 0600", path)
            os.chmod(path, 0o600)
        return text
    secret = secrets.token_hex(_SECRET_BYTES)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        # Another gateway process created it first: use theirs so that both derive the same salts.
        return load_or_create_secret(path)
    except OSError as exc:
        raise ConfigError(f"cannot create the server secret file {path}: {exc}") from exc
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(secret + "\n")
    log.info("generated a new server secret in %s", path)
    return secret
