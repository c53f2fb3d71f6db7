"""Rule advice: what the gateway estimated a request would have hit with a rule or setting its tenant does not have on.

`AdviceOutcome` is one candidate's estimate for one sampled request; it travels on the request's `RequestRecord`
(`advice`) and is folded into the `hourly_advice` rollup in the same transaction as the request row, so a replayed
record never counts twice. `CANDIDATES` names every candidate the gateway's advisor can propose, with what it changes
in the prompt (in one sentence), whether it moves content (so changes what the model reads), and the
`prefixscope.toml` lines that switch it on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

# The gateway's normalization rules (`gateway.config.tenant`; the db package does not import the gateway).
SEMANTIC_RULES: Final = ("newlines", "tool_schema_key_order", "tool_order", "tool_call_arguments_key_order")
HOIST_PLACEMENTS: Final = ("after_system", "end")
CANDIDATE_MAX = 64
SETTINGS_FINGERPRINT_MAX: Final = 16
# Estimates resting on fewer sampled requests than this are not shown.
DEFAULT_MIN_SAMPLES: Final = 10


@dataclass(frozen=True, slots=True)
class AdviceOutcome:
    """One candidate's estimate for one sampled request.

    `prompt_tokens` is the prompt length the rewritten request would have had and `cached_tokens` the tokens it would
    have been served from cache (an estimate, see `gateway.advisor`); `changed` says whether the candidate changed this
    request at all. `settings` fingerprints the tenant settings the request was actually served under
    (`gateway.advisor.candidates.settings_fingerprint`), so advice rests only on samples taken under the current ones.
    """

    candidate: str
    prompt_tokens: int
    cached_tokens: int
    changed: bool
    settings: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "changed": self.changed,
            "settings": self.settings,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdviceOutcome:
        return cls(
            candidate=str(data["candidate"]),
            prompt_tokens=int(data["prompt_tokens"]),
            cached_tokens=int(data["cached_tokens"]),
            changed=bool(data["changed"]),
            settings=str(data.get("settings") or ""),
        )


@dataclass(frozen=True, slots=True)
class CandidateInfo:
    """What a candidate is, for people: a title, one sentence on what it changes, and whether it moves content."""

    key: str
    title: str
    description: str
    moves_content: bool
    rules: dict[str, bool]
    placement: str | None = None

    def toml_lines(self, tenant: str) -> list[str]:
        """The `prefixscope.toml` lines that switch this candidate on for `tenant` (merge the `rules` entries into an
        existing `rules = {...}` of that table)."""
        lines = [f"[tenants.{toml_key(tenant)}]"]
        if self.rules:
            rules = ", ".join(f"{name} = {'true' if on else 'false'}" for name, on in self.rules.items())
            lines.append(f"rules = {{ {rules} }}")
        if self.placement is not None:
            lines.append(f'hoist_placement = "{self.placement}"')
        return lines


# TOML forbids declaring a table or a key twice, so appending these lines to a file that already has the tenant's
# table (or its `rules`) makes the whole file fail to load.
MERGE_HINT: Final = "merge into the tenant's table and rules if the file has them: TOML rejects a second copy"


def toml_key(name: str) -> str:
    """`name` as a TOML key: bare when it can be, else quoted."""
    bare = name.replace("-", "").replace("_", "")
    if name and bare.isascii() and bare.isalnum():
        return name
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


_RULE_SENTENCES = {
    "newlines": "turns CRLF and lone CR line endings into LF and removes byte-order marks in message text",
    "tool_schema_key_order": "sorts the keys inside every tool definition, so the same schema renders the same bytes",
    "tool_order": "sorts the tool list by type and function name, so tools sent in another order render the same",
    "tool_call_arguments_key_order": "writes a re-serialised copy of a tool call the gateway returned back as it was "
    "returned, so the upstream's cached answer matches",
}
_HOIST_SENTENCES = {
    "after_system": "moves dates, times and ids out of the system prompt into a short note right after it",
    "end": "moves dates, times and ids from the system prompt to a short note at the end of the conversation",
}


def _catalog() -> dict[str, CandidateInfo]:
    catalog = {
        rule: CandidateInfo(rule, f"turn on rule {rule}", _RULE_SENTENCES[rule], False, {rule: True})
        for rule in SEMANTIC_RULES
    }
    catalog["default_rules"] = CandidateInfo(
        "default_rules",
        "turn on all the default rules",
        "turns on every semantics-preserving rule: canonical key order in tools, returned tool calls re-sent as "
        "returned, sorted tools, and LF line endings",
        False,
        dict.fromkeys(SEMANTIC_RULES, True),
    )
    for placement in HOIST_PLACEMENTS:
        key = f"hoist_volatile:{placement}"
        catalog[key] = CandidateInfo(
            key,
            f"turn on hoist_volatile (placement {placement})",
            _HOIST_SENTENCES[placement],
            True,
            {"hoist_volatile": True},
            placement,
        )
        key = f"hoist_placement:{placement}"
        catalog[key] = CandidateInfo(
            key,
            f"switch hoist_placement to {placement}",
            _HOIST_SENTENCES[placement],
            True,
            {},
            placement,
        )
    return catalog


CANDIDATES: Final = _catalog()
# Candidates of which at most one can be enabled (one hoist placement): only the best of a group is recommended.
EXCLUSIVE_GROUPS: Final = ("hoist_volatile:", "hoist_placement:")


def exclusive_group(key: str) -> str | None:
    """The group of mutually exclusive candidates `key` belongs to (its key prefix), or None."""
    return next((group for group in EXCLUSIVE_GROUPS if key.startswith(group)), None)


def candidate_info(key: str) -> CandidateInfo:
    """The catalog entry of `key`; an unknown key (from a newer gateway) gets a neutral entry."""
    info = CANDIDATES.get(key)
    if info is not None:
        return info
    return CandidateInfo(key, key, "a rule this version does not describe", True, {})
