"""The candidates of a tenant: every rule or setting it does not have on, as the settings it would run with.

- each semantics-preserving rule that is off, and all of them together when more than one is;
- `hoist_volatile` with each placement, when it is off; the other placement, when it is on.

Candidate keys are those of `db.advice.CANDIDATES`, which says what each changes for the reports.
`settings_fingerprint` names the settings a request was served under, for the `hourly_advice` rollup.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from gateway.config.tenant import HOIST_PLACEMENTS, SEMANTIC_RULES, TenantSettings


def settings_fingerprint(settings: TenantSettings) -> str:
    """16 hex digits (SHA-256) over what decides the prompt the upstream gets: the rules that are on, the hoist
    placement and the volatile patterns (when hoisting is on). Equal settings give equal fingerprints."""
    parts = ["rules=" + ",".join(sorted(settings.rules))]
    if "hoist_volatile" in settings.rules:
        parts.append("placement=" + settings.hoist_placement)
        parts.extend("pattern=" + pattern for pattern in settings.volatile_patterns)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One counterfactual: its key (`db.advice.CANDIDATES`) and the tenant settings it stands for."""

    key: str
    settings: TenantSettings


def candidates_for(settings: TenantSettings) -> tuple[Candidate, ...]:
    """The tenant's candidates, in a fixed order (semantic rules, then hoisting)."""
    found: list[Candidate] = []
    off = [rule for rule in SEMANTIC_RULES if rule not in settings.rules]
    for rule in off:
        found.append(Candidate(rule, replace(settings, rules=settings.rules | {rule})))
    if len(off) > 1:
        found.append(Candidate("default_rules", replace(settings, rules=settings.rules | set(SEMANTIC_RULES))))
    if "hoist_volatile" not in settings.rules:
        for placement in HOIST_PLACEMENTS:
            found.append(
                Candidate(
                    f"hoist_volatile:{placement}",
                    replace(settings, rules=settings.rules | {"hoist_volatile"}, hoist_placement=placement),
                )
            )
    else:
        for placement in HOIST_PLACEMENTS:
            if placement != settings.hoist_placement:
                found.append(Candidate(f"hoist_placement:{placement}", replace(settings, hoist_placement=placement)))
    return tuple(found)
