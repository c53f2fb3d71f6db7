"""Finding fleet-wide patterns in prompt signatures (`db.signatures`), across tenants and conversations.

Three kinds, each with what it costs and what to do:

- `span`: static heads (system prompts) that are the same text but for one span at the same place, e.g. a tenant
  name or a date inside a long shared prompt. Signatures are grouped by a block they share at the start, at the end,
  or the first two of either; within a group, the leading head blocks and leading tail blocks all members share
  bound the span: it lies in characters `[shared_head_chars, text_chars - shared_tail_chars)`. A group is a pattern
  when it has at least two variants, the span is at most `max_span_chars` long and the shared text at least
  `min_shared_chars`. Cost: per request, the tokens from the span's start to the end of the static head, which no
  variant can read from another's cache entry. Action: move the span to the end (or a later message), or
  parameterize it.
- `tool_order`: the same set of tools sent in different orders. Cost: per request outside the most common order,
  the tool tokens (everything after the tools is recomputed too). Action: pin the tool order (the `tool_order` rule
  sorts them).
- `one_tool`: tool lists that differ by one tool (one added, or one replaced). Cost: the tool tokens of each request
  outside the most common list. Action: send the union of the tools, or put the varying tool last.

The work is bounded by the number of signatures (the query reads at most a fixed number of the latest) and by the
caps on blocks and tools per signature; it runs in the CLI or the dashboard, never on the request path.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from db.signatures import PromptSignature

DEFAULT_MAX_SPAN_CHARS: Final = 256
DEFAULT_MIN_SHARED_CHARS: Final = 512
MAX_TOOLS: Final = 128


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """One sampled request's signature with its tenant."""

    tenant: str
    signature: PromptSignature


@dataclass(frozen=True, slots=True)
class FleetPattern:
    """One pattern: its kind, how many requests, tenants and variants share it, where it is, the tokens it costs
    (`tokens_total` over the requests read, `tokens_per_request` on average over those it costs) and the action."""

    kind: str
    requests: int
    tenants: int
    variants: int
    where: str
    shared_tokens: int
    tokens_per_request: float
    tokens_total: int
    action: str


def common_leading(lists: Sequence[Sequence[int]]) -> int:
    """How many leading items every list shares."""
    if not lists:
        return 0
    shortest = min(len(items) for items in lists)
    count = 0
    while count < shortest and all(items[count] == lists[0][count] for items in lists):
        count += 1
    return count


def find_patterns(
    requests: Iterable[SignedRequest],
    max_span_chars: int = DEFAULT_MAX_SPAN_CHARS,
    min_shared_chars: int = DEFAULT_MIN_SHARED_CHARS,
    top: int = 20,
) -> list[FleetPattern]:
    """The patterns of every kind, the costliest first (at most `top`)."""
    items = list(requests)
    found = _span_patterns(items, max_span_chars, min_shared_chars) + _tool_patterns(items)
    found.sort(key=lambda p: (-p.tokens_total, p.kind, p.where))
    return found[:top]


def _span_patterns(items: list[SignedRequest], max_span_chars: int, min_shared_chars: int) -> list[FleetPattern]:
    groups: dict[tuple, list[SignedRequest]] = defaultdict(list)
    for item in items:
        sig = item.signature
        if len(sig.head) < 2 or len(sig.tail) < 2:
            continue
        for key in (("ends", sig.head[0], sig.tail[0]), ("head", *sig.head[:2]), ("tail", *sig.tail[:2])):
            groups[key].append(item)
    seen: set[frozenset] = set()
    patterns = []
    for members in groups.values():
        variants = {(m.signature.head, m.signature.tail) for m in members}
        if len(variants) < 2:
            continue
        identity = frozenset(variants)
        if identity in seen:
            continue
        seen.add(identity)
        block = members[0].signature.block_chars
        if any(m.signature.block_chars != block for m in members):
            continue
        distinct = list(variants)
        head = common_leading([v[0] for v in distinct]) * block
        tail = common_leading([v[1] for v in distinct]) * block
        longest = max(m.signature.text_chars for m in members)
        span = max(0, longest - head - tail)
        if span > max_span_chars or head + tail < min_shared_chars:
            continue
        costs = [(m.signature.text_chars - head) * m.signature.tokens_per_char() for m in members]
        shared = round((head + tail) * members[0].signature.tokens_per_char())
        patterns.append(
            FleetPattern(
                kind="span",
                requests=len(members),
                tenants=len({m.tenant for m in members}),
                variants=len(variants),
                where=f"system prompt, characters {head}-{head + span} of {longest} (block-exact)",
                shared_tokens=shared,
                tokens_per_request=round(sum(costs) / len(costs), 1),
                tokens_total=round(sum(costs)),
                action="move the varying span to the end of the prompt or into a later message, or parameterize it, "
                "so the text before and after it is cached once for every variant",
            )
        )
    return patterns


def _tool_tokens(sig: PromptSignature) -> float:
    return sig.tool_chars * sig.tokens_per_char()


def _tool_patterns(items: list[SignedRequest]) -> list[FleetPattern]:
    with_tools = [i for i in items if 0 < len(i.signature.tools) <= MAX_TOOLS]
    patterns = []
    by_set: dict[tuple[int, ...], list[SignedRequest]] = defaultdict(list)
    for item in with_tools:
        by_set[tuple(sorted(item.signature.tools))].append(item)
    for tools, members in by_set.items():
        orders = Counter(m.signature.tools for m in members)
        if len(orders) < 2:
            continue
        common = orders.most_common(1)[0][0]
        costly = [m for m in members if m.signature.tools != common]
        patterns.append(_tool_pattern("tool_order", members, costly, len(orders), f"tools ({len(tools)} tools)",
                                      "pin the tool order: send the tools sorted by name (the tool_order rule does "
                                      "it in the gateway)"))
    # One tool apart: two sets that are equal after removing one tool from one (added) or from both (replaced).
    keys: dict[tuple[int, ...], set[tuple[int, ...]]] = defaultdict(set)
    for tools in by_set:
        keys[tools].add(tools)
        for position in range(len(tools)):
            keys[tools[:position] + tools[position + 1 :]].add(tools)
    seen: set[frozenset] = set()
    for base, sets in keys.items():
        if len(sets) < 2 or not base:
            continue
        identity = frozenset(sets)
        if identity in seen:
            continue
        seen.add(identity)
        members = [m for tools in sets for m in by_set[tools]]
        common = Counter(tuple(sorted(m.signature.tools)) for m in members).most_common(1)[0][0]
        costly = [m for m in members if tuple(sorted(m.signature.tools)) != common]
        where = f"tools ({len(base)} shared, one differs)"
        patterns.append(_tool_pattern("one_tool", members, costly, len(sets), where,
                                      "send the union of the tools so the shared tools stay cached (putting the "
                                      "one that varies last helps only with the gateway's tool_order rule off: it "
                                      "sorts tools by name)"))
    return patterns


def _tool_pattern(
    kind: str, members: list[SignedRequest], costly: list[SignedRequest], variants: int, where: str, action: str
) -> FleetPattern:
    costs = [_tool_tokens(m.signature) for m in costly]
    return FleetPattern(
        kind=kind,
        requests=len(members),
        tenants=len({m.tenant for m in members}),
        variants=variants,
        where=where,
        shared_tokens=round(min(_tool_tokens(m.signature) for m in members)),
        tokens_per_request=round(sum(costs) / len(costs), 1) if costs else 0.0,
        tokens_total=round(sum(costs)),
        action=action,
    )
