"""The rule interface.

A rule takes the parsed request body (a JSON object as a dict) and returns a `RuleResult`. Rules are pure: they
never mutate their input, and they return the very same object when nothing changed (so `changed` is cheap to
trust and unchanged requests cost no copies). Rules are idempotent: applying one to its own output changes
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

Request = dict[str, Any]


@dataclass(frozen=True, slots=True)
class RuleResult:
    request: Request
    changed: bool


class Rule(Protocol):
    """A named request rewrite."""

    name: str

    def apply(self, request: Request) -> RuleResult: ...


def unchanged(request: Request) -> RuleResult:
    return RuleResult(request, False)
