"""Per-tenant settings: normalization rules, prompt storage, how misses are explained and cache retention.

Example (in `prefixscope.toml`)::

    [tenant_defaults]
    store_prompt_text = false
    explain_history_size = 1000         # recent requests remembered per tenant to explain misses
    uplift_sample_rate = 0.1            # share of requests whose normalization gain is measured (dry-run match)
    advice_sample_rate = 0.1            # above 0: the rule advisor samples every request while it has capacity; 0: off
    hash_chain = true                   # record each prompt's block hash chain
    hash_block_size = 16                # tokens per hashed block
    max_cache_retention = "1h"          # the longest retention class a request may get (see retention.py here)
    diagnostics = false                 # ask OpenAI/Anthropic upstreams for their own cache diagnostics

    [tenants.acme]
    rules = { tool_order = false, hoist_volatile = true }
    volatile_patterns = ['\\d{4}-\\d{2}-\\d{2}']
    cache_retention = "1h"              # the class sent when a request names none (absent: the engine's default)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gateway.config.retention import LONGEST_CLASS, RetentionPolicy, parse_retention
from gateway.config.volatile_patterns import DEFAULT_VOLATILE_PATTERNS, compile_patterns
from gateway.errors import ConfigError

SEMANTIC_RULES = ("newlines", "tool_schema_key_order", "tool_order", "tool_call_arguments_key_order")
OPT_IN_RULES = ("hoist_volatile",)
ALL_RULES = SEMANTIC_RULES + OPT_IN_RULES
HOIST_PLACEMENTS = ("after_system", "end")
MAX_HASH_BLOCK_SIZE = 1024


@dataclass(frozen=True)
class TenantSettings:
    """Per-tenant behaviour: which normalization rules run, whether prompt text is stored, how misses are
    explained (history size, the share of requests whose normalization gain is measured, hash chains) and which cache
    retention class requests get (`cache_retention`: sent when a request names none, None: send none;
    `max_cache_retention`: the longest a request may get)."""

    rules: frozenset[str] = frozenset(SEMANTIC_RULES)
    volatile_patterns: tuple[str, ...] = DEFAULT_VOLATILE_PATTERNS
    hoist_placement: str = "after_system"
    store_prompt_text: bool = False
    explain_history_size: int = 1000
    uplift_sample_rate: float = 0.1
    advice_sample_rate: float = 0.1
    hash_chain: bool = True
    hash_block_size: int = 16
    cache_retention: str | None = None
    max_cache_retention: str = LONGEST_CLASS
    # Ask upstream providers for their own prompt-cache diagnostics (`gateway.provider_diagnostics`).
    diagnostics: bool = False

    @property
    def retention(self) -> RetentionPolicy:
        return RetentionPolicy(self.cache_retention, self.max_cache_retention)


def parse_tenant(values: dict[str, Any], base: TenantSettings) -> TenantSettings:
    """Settings from a `[tenant_defaults]` or `[tenants.NAME]` table (popped from `values`) over `base`."""
    rules = set(base.rules)
    for name, enabled in dict(values.pop("rules", {})).items():
        if name not in ALL_RULES:
            raise ConfigError(f"unknown normalization rule {name!r}; known: {ALL_RULES}")
        (rules.add if enabled else rules.discard)(name)
    # Shorthand: `hoist_volatile = true` at the tenant level.
    if "hoist_volatile" in values:
        (rules.add if values.pop("hoist_volatile") else rules.discard)("hoist_volatile")
    patterns = tuple(str(p) for p in values.pop("volatile_patterns", base.volatile_patterns))
    try:
        compile_patterns(patterns)
    except (re.error, ValueError) as exc:
        raise ConfigError(f"volatile_patterns: {exc}") from None
    placement = str(values.pop("hoist_placement", base.hoist_placement))
    if placement not in HOIST_PLACEMENTS:
        raise ConfigError(f"hoist_placement must be one of {HOIST_PLACEMENTS}")
    store_prompt_text = bool(values.pop("store_prompt_text", base.store_prompt_text))
    explain = _parse_explain(values, base)
    retention = parse_retention(values, base.retention)
    diagnostics = values.pop("diagnostics", base.diagnostics)
    if not isinstance(diagnostics, bool):
        raise ConfigError("diagnostics must be true or false")
    if values:
        raise ConfigError(f"unknown tenant settings: {sorted(values)}")
    return TenantSettings(
        rules=frozenset(rules),
        volatile_patterns=patterns,
        hoist_placement=placement,
        store_prompt_text=store_prompt_text,
        cache_retention=retention.default,
        max_cache_retention=retention.maximum,
        diagnostics=diagnostics,
        **explain,
    )


def _parse_explain(values: dict[str, Any], base: TenantSettings) -> dict[str, Any]:
    """The miss-explanation settings of a tenant (popped from `values`), validated."""
    try:
        history_size = int(values.pop("explain_history_size", base.explain_history_size))
        sample_rate = float(values.pop("uplift_sample_rate", base.uplift_sample_rate))
        advice_rate = float(values.pop("advice_sample_rate", base.advice_sample_rate))
        block_size = int(values.pop("hash_block_size", base.hash_block_size))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"tenant settings: {exc}") from None
    hash_chain = values.pop("hash_chain", base.hash_chain)
    if not isinstance(hash_chain, bool):
        raise ConfigError("hash_chain must be true or false")
    if history_size < 1:
        raise ConfigError("explain_history_size must be at least 1")
    if not 0.0 <= sample_rate <= 1.0:
        raise ConfigError("uplift_sample_rate must be between 0 and 1")
    if not 0.0 <= advice_rate <= 1.0:
        raise ConfigError("advice_sample_rate must be between 0 and 1")
    if not 1 <= block_size <= MAX_HASH_BLOCK_SIZE:
        raise ConfigError(f"hash_block_size must be between 1 and {MAX_HASH_BLOCK_SIZE}")
    return {
        "explain_history_size": history_size,
        "uplift_sample_rate": sample_rate,
        "advice_sample_rate": advice_rate,
        "hash_chain": hash_chain,
        "hash_block_size": block_size,
    }
