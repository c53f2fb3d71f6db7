"""The `prompt_cache_key` the gateway sends to OpenAI upstreams, derived per tenant and prefix.

OpenAI routes a request to a cache machine by a hash of its prompt's first tokens combined with `prompt_cache_key`
("Prompt caching" guide): requests with the same key and prefix land on the same machines. A client's own key cannot
be trusted to keep tenants apart (every tenant of one upstream entry shares one organization), and no key at all
spreads a tenant's long prefixes over machines as the hash falls. So the gateway replaces whatever the client sent with

    "ps-" + hex(BLAKE2b-96(prefix material || NUL || client key, key = HMAC-SHA256(tenant salt, CONTEXT)))

where the prefix material is the request's stable prefix as `gateway.fingerprint.prefix_material` encodes it (tools,
instructions, leading system messages), the client key (empty when absent) keeps the client's own bucketing within
the tenant, and the tenant salt is the server-side HMAC of the server secret and the tenant (`gateway.tenancy`).
The same tenant with the same prefix always gets the same key; two tenants never share one, and the key reveals
neither the tenant nor the prompt.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from gateway.fingerprint import prefix_material
from gateway.parsing import CHAT, COMPLETIONS, RESPONSES

FIELD = "prompt_cache_key"
_CONTEXT = b"prefixscope/prompt-cache-key/v1"


def endpoint_of(body: dict[str, Any]) -> str:
    """Which API a request body belongs to, from its shape (`input`: Responses, `messages`: chat)."""
    if "input" in body:
        return RESPONSES
    return CHAT if "messages" in body else COMPLETIONS


def derive_prompt_cache_key(salt: str, body: dict[str, Any]) -> str:
    """The key for `body` (the client's own `prompt_cache_key` taken into it) under the tenant's `salt`."""
    key = hmac.new(salt.encode("utf-8"), _CONTEXT, hashlib.sha256).digest()
    client_key = body.get(FIELD)
    material = (prefix_material(endpoint_of(body), body) or b"") + b"\x00"
    material += client_key.encode("utf-8", "replace") if isinstance(client_key, str) else b""
    return "ps-" + hashlib.blake2b(material, digest_size=12, key=key).hexdigest()
