"""What caching a prefix costs and saves, per upstream kind: the retention advisor's cost model.

Two families:

- **Hosted** (`anthropic`, `openai`): prices are multipliers of the model's base input-token price. A prompt token is
  billed `1.0` when nothing is cached, `write[class]` when a request writes it to the cache, `read` when it is served
  from the cache. The net saving of a class is `cost(no caching) - cost(class)`, in base-input-token equivalents.
  Defaults are the providers' published multipliers:

  - Anthropic (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching, "Pricing"): a 5-minute cache
    write costs 1.25x the base input price, a 1-hour write 2x, a cache read 0.1x. Reads refresh the lifetime at no
    cost. There is no persistent class, so `persistent` is priced as the 1-hour class it falls back to.
  - OpenAI (https://platform.openai.com/docs/guides/prompt-caching): caching is automatic "with no additional fees"
    (a write costs 1.0x), and cached input is discounted per model (50% on gpt-4o, 75% on gpt-4.1, 90% on gpt-5;
    0.5 is the default here, set `read` for the model in use). In-memory retention (`5m`) and extended retention
    (`prompt_cache_retention = "24h"`, used for `1h` and `persistent`) cost the same.

- **Local** (`local_engine`, `vllm`, `sglang`): nothing is billed per token; a hit saves prefill time and a cached
  prefix holds tier capacity while it lives. Saving = `hit tokens x prefill_ms_per_token - held token-hours x
  held_ms_per_token_hour[tier]`, in milliseconds of prefill. The held price says how many ms of prefill one token
  held for one hour in that tier would have to save to be worth its place, so it follows how scarce the tier is:

  - `device` 0.5 ms: a token on the accelerator is worth holding for an hour when it is read about once an hour at
    ~2k tokens/s prefill (device memory is the scarcest: every token held there is one a running batch cannot use);
  - `host` 0.1 ms: host memory is several times larger than the device pool and several times cheaper per byte, so
    a token there displaces about a fifth as much;
  - `disk` 0.01 ms: local NVMe holds tens of times more than host memory at a thirtieth of its price per byte.

  A prefix's entry is priced at the tiers its reads were served from, weighted by their tokens (`held_price`; one
  never read, or read with no tier reported, is priced as `device`, where a write lands). Loading a host or disk
  copy back costs some of the prefill a hit saves; that is not subtracted.

`CostModel.for_kind(kind, overrides)` builds one; overrides come from `[advice.cache_prices.<upstream>]` in
`prefixscope.toml` (`db.retention.prices`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

# Retention classes (`db.records.RETENTION_CLASSES`) and their idle lifetimes in seconds (None: never expires), as
# the local engine applies them.
CLASS_TTL_S: Final[dict[str, float | None]] = {"5m": 300.0, "1h": 3600.0, "persistent": None}
NO_CACHE: Final = "none"  # the "do not cache" choice
HOSTED_KINDS: Final = ("anthropic", "openai")
LOCAL_KINDS: Final = ("local_engine", "vllm", "sglang")

ANTHROPIC_WRITE: Final = {"5m": 1.25, "1h": 2.0, "persistent": 2.0}
ANTHROPIC_READ: Final = 0.1
OPENAI_WRITE: Final = {"5m": 1.0, "1h": 1.0, "persistent": 1.0}
OPENAI_READ: Final = 0.5
DEFAULT_PREFILL_MS_PER_TOKEN: Final = 0.5
DEFAULT_HELD_MS_PER_TOKEN_HOUR: Final = {"device": 0.5, "host": 0.1, "disk": 0.01}
HELD_FIELD: Final = "held_ms_per_token_hour"  # the override for every tier at once; `<field>_<tier>` for one


class PriceError(ValueError):
    """A cache price override that is not a non-negative number, or names an unknown field."""


@dataclass(frozen=True, slots=True)
class CostModel:
    """Prices of one upstream. `kind` is the upstream kind; `hosted` chooses the family (see the module doc).

    Hosted: `write` maps each retention class to its write multiplier, `read` is the read multiplier (both of the base
    input price). Local: `prefill_ms_per_token` is what a hit saves per token, `held_ms_per_token_hour` maps each tier
    (`device`, `host`, `disk`) to what holding one token there for one hour costs, both in ms of prefill.
    """

    kind: str
    hosted: bool
    write: Mapping[str, float] = field(default_factory=dict)
    read: float = 0.0
    prefill_ms_per_token: float = DEFAULT_PREFILL_MS_PER_TOKEN
    held_ms_per_token_hour: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_HELD_MS_PER_TOKEN_HOUR))

    @property
    def unit(self) -> str:
        """What a saving is counted in: `tokens` (base-input-token equivalents) or `ms` (of prefill)."""
        return "tokens" if self.hosted else "ms"

    @property
    def classes(self) -> tuple[str, ...]:
        """The retention classes this upstream offers (hosted APIs have no persistent class of their own)."""
        return ("5m", "1h") if self.hosted else tuple(CLASS_TTL_S)

    def held_price(self, read_tokens_by_tier: Mapping[str, int] | None = None) -> float:
        """ms of prefill one token held for one hour costs, for an entry whose reads each tier served as given
        (tokens per tier): the tiers' prices weighted by those tokens; the device price without any."""
        weights = {tier: tokens for tier, tokens in (read_tokens_by_tier or {}).items()
                   if tokens > 0 and tier in self.held_ms_per_token_hour}
        total = sum(weights.values())
        if not total:
            return self.held_ms_per_token_hour["device"]
        return sum(self.held_ms_per_token_hour[tier] * tokens for tier, tokens in weights.items()) / total

    @classmethod
    def for_kind(cls, kind: str, overrides: Mapping[str, Any] | None = None) -> CostModel:
        """The published defaults of `kind` with `overrides` applied: `write_5m`, `write_1h`, `write_persistent`,
        `read` (hosted) or `prefill_ms_per_token`, `held_ms_per_token_hour` (every tier) and
        `held_ms_per_token_hour_device`, `_host`, `_disk` (one tier, over the former) (local). Raises `PriceError` for
        an unknown field or a negative or non-numeric value."""
        if kind == "anthropic":
            model = cls(kind, True, dict(ANTHROPIC_WRITE), ANTHROPIC_READ)
        elif kind == "openai":
            model = cls(kind, True, dict(OPENAI_WRITE), OPENAI_READ)
        else:
            model = cls(kind, False)
        return model.with_overrides(overrides or {})

    def with_overrides(self, overrides: Mapping[str, Any]) -> CostModel:
        write = dict(self.write)
        held = dict(self.held_ms_per_token_hour)
        changes: dict[str, Any] = {}
        tiers = {f"{HELD_FIELD}_{tier}": tier for tier in DEFAULT_HELD_MS_PER_TOKEN_HOUR}
        # The every-tier price first, so a per-tier one wins whatever the order in the file.
        for name, value in sorted(overrides.items(), key=lambda item: item[0] != HELD_FIELD):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise PriceError(f"cache price {name!r} must be a non-negative number, not {value!r}")
            if self.hosted and name.startswith("write_") and name[len("write_") :] in CLASS_TTL_S:
                write[name[len("write_") :]] = float(value)
            elif self.hosted and name == "read":
                changes["read"] = float(value)
            elif not self.hosted and name == "prefill_ms_per_token":
                changes[name] = float(value)
            elif not self.hosted and name == HELD_FIELD:
                held = dict.fromkeys(held, float(value))
            elif not self.hosted and name in tiers:
                held[tiers[name]] = float(value)
            else:
                allowed = "write_5m, write_1h, write_persistent, read" if self.hosted else (
                    f"prefill_ms_per_token, {HELD_FIELD}, {', '.join(tiers)}"
                )
                raise PriceError(f"unknown cache price {name!r} for kind {self.kind!r} (allowed: {allowed})")
        return replace(self, write=write, held_ms_per_token_hour=held, **changes)
