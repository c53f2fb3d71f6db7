"""An ordered list of rules, built once per tenant from its settings."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.config import ALL_RULES, TenantSettings
from gateway.normalize.base import Request, Rule
from gateway.normalize.rules import (
    Newlines,
    ReturnedArguments,
    ToolCallArgumentsKeyOrder,
    ToolOrder,
    ToolSchemaKeyOrder,
)
from gateway.normalize.volatile import HoistVolatile

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NormalizationResult:
    request: Request
    applied_rules: tuple[str, ...]  # names of the rules that changed something, in pipeline order


class Pipeline:
    """Runs rules in order; a rule's output is the next rule's input."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = tuple(rules)

    @property
    def rule_names(self) -> tuple[str, ...]:
        return tuple(rule.name for rule in self.rules)

    def apply(self, request: Request) -> NormalizationResult:
        """Run every rule. A rule that fails on some unusual input (say, JSON nested deeper than the recursion
        limit) is skipped for that request rather than failing it: normalization is an optimisation."""
        applied: list[str] = []
        for rule in self.rules:
            try:
                result = rule.apply(request)
            except Exception:
                log.warning("normalization rule %s failed; skipped for this request", rule.name, exc_info=True)
                continue
            if result.changed:
                applied.append(rule.name)
                request = result.request
        return NormalizationResult(request, tuple(applied))


def make_rule(name: str, settings: TenantSettings, returned: ReturnedArguments | None = None) -> Rule:
    """The rule called `name` with the tenant's settings; `returned` looks up the tool calls the gateway returned
    to the tenant (`ToolCallArgumentsKeyOrder`). Raises ValueError for an unknown name."""
    if name == "newlines":
        return Newlines()
    if name == "tool_schema_key_order":
        return ToolSchemaKeyOrder()
    if name == "tool_order":
        return ToolOrder()
    if name == "tool_call_arguments_key_order":
        return ToolCallArgumentsKeyOrder(returned)
    if name == "hoist_volatile":
        return HoistVolatile(settings.volatile_patterns, settings.hoist_placement)
    raise ValueError(f"unknown normalization rule {name!r}")


def build_pipeline(settings: TenantSettings, returned: ReturnedArguments | None = None) -> Pipeline:
    """The tenant's enabled rules in the canonical order (`ALL_RULES`): text first, then tools, then hoisting.
    `returned`: the tool calls the gateway returned to this tenant (without it, tool calls are left as sent)."""
    return Pipeline([make_rule(name, settings, returned) for name in ALL_RULES if name in settings.rules])
