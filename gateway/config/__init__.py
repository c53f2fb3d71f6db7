"""The gateway's settings, below every feature: this package imports no feature module, and features import it.

Where each setting lives: `settings` (the listen address, upstreams, routes, auth; `GatewayConfig` holds them all),
`tenant` (`[tenant_defaults]`, `[tenants.NAME]`), `retention` (a tenant's cache retention classes),
`volatile_patterns` (the default patterns of `hoist_volatile`), `router` (`[upstreams.router]`: routing over a
replica set), `messages` (`[messages]`: the Anthropic Messages API), and `db.writer_config.WriterConfig` (`[recorder]`,
the record writer's settings, shared with db). `loading` reads the TOML file and the command line into them.
Nothing here reads the process environment: the CLI reads it once and passes values in.

Example `prefixscope.toml`::

    [gateway]
    host = "127.0.0.1"
    port = 8080
    default_upstream = "local"
    max_body_bytes = 8388608
    # server_secret = "..."            # else generated once and kept in secret_file (0600)
    # secret_file = "/srv/prefixscope/gateway_secret"   # default: gateway_secret in the state directory
    # database_url = "postgresql+asyncpg://..."         # default: prefixscope.db in the state directory
    auth = "keys"                       # keys | none (open: no key checked; the same as --open)

    [auth]
    max_key_staleness_s = 60            # refuse requests (503) once the key table has been unreadable this long
    # snapshot_path = "/srv/prefixscope/key_snapshot.json"   # default: key_snapshot.json in the state directory

    [recorder]
    durability = "spill_first"          # spill_first | queue_first (see README: what each mode can lose)

    [[upstreams]]
    name = "local"
    url = "http://127.0.0.1:8001"
    kind = "local_engine"               # local_engine | openai | vllm | sglang | anthropic
    # replicas = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]   # a replica set instead of `url`
    # routing = "cache_aware"           # cache_aware | round_robin | least_loaded (see gateway/config/router.py)
    timeout = 600                       # seconds
    # api_key = "sk-..."

    [[upstreams]]                       # every upstream a route names must be listed
    name = "openai"
    url = "https://api.openai.com"
    kind = "openai"
    # api_key = "sk-..."

    [routes]                            # model -> upstream name; other models go to default_upstream
    "gpt-4o-mini" = "openai"

    [tenant_defaults]
    store_prompt_text = false
    explain_history_size = 1000         # recent requests remembered per tenant to explain misses
    uplift_sample_rate = 0.1            # share of requests whose normalization gain is measured (dry-run match)
    advice_sample_rate = 0.1            # above 0: the rule advisor samples every request while it has capacity; 0: off
    hash_chain = true                   # record each prompt's block hash chain
    hash_block_size = 16                # tokens per hashed block
    max_cache_retention = "persistent"  # the longest cache retention class a request may get (5m | 1h | persistent)

    [tenants.acme]
    rules = { tool_order = false, hoist_volatile = true }
    volatile_patterns = ['\\d{4}-\\d{2}-\\d{2}']
    cache_retention = "1h"              # the class sent when a request names none (absent: the engine's default)

    [messages]                          # the Anthropic Messages API (see gateway/config/messages.py)
    min_cacheable_tokens = 1024
"""

from __future__ import annotations

from db.writer_config import DEFAULT_SPILL_PATH, DURABILITY_MODES, WriterConfig
from gateway.config.loading import apply_overrides, load_config, parse_config
from gateway.config.messages import MessagesSettings
from gateway.config.router import ROUTING_POLICIES, RouterSettings
from gateway.config.settings import (
    AUTH_MODES,
    DEFAULT_KEY_SNAPSHOT_PATH,
    DEFAULT_SECRET_FILE,
    DEFAULT_UPSTREAM_URL,
    UPSTREAM_KINDS,
    ConfigOverrides,
    GatewayConfig,
    UpstreamConfig,
)
from gateway.config.tenant import ALL_RULES, HOIST_PLACEMENTS, OPT_IN_RULES, SEMANTIC_RULES, TenantSettings

__all__ = [
    "ALL_RULES",
    "AUTH_MODES",
    "DEFAULT_KEY_SNAPSHOT_PATH",
    "DEFAULT_SECRET_FILE",
    "DEFAULT_SPILL_PATH",
    "DEFAULT_UPSTREAM_URL",
    "DURABILITY_MODES",
    "HOIST_PLACEMENTS",
    "OPT_IN_RULES",
    "ROUTING_POLICIES",
    "SEMANTIC_RULES",
    "UPSTREAM_KINDS",
    "ConfigOverrides",
    "GatewayConfig",
    "MessagesSettings",
    "RouterSettings",
    "TenantSettings",
    "UpstreamConfig",
    "WriterConfig",
    "apply_overrides",
    "load_config",
    "parse_config",
]
