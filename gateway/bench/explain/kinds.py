"""The injected changes: each kind plays a conversation (or two requests) through a `Context` and returns the graded
request with its ground truth.

Ground truth of a request: the miss reason to record (`db.records.MISS_REASONS`), where the prompt diverged (a
`Location` in the engine's terms, see `layout`), the ledger part that must carry the tokens the cache could not serve
(`new` or one of `db.ledger.LOST_CAUSES`; `page_alignment` may always take the partial page besides), and for an
eviction the tier the prompt was dropped from. The location is the first character no earlier request of the tenant
had sent and computed (`layout.divergence` against what the cache held), or the prompt's start when nothing of it
could be served (evicted, expired, routed away, a new prefix, another tenant's), or the model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.bench.explain import material as m
from gateway.bench.explain.conversation import REASONED_TOKENS, Context, Conversation
from gateway.bench.explain.layout import MODEL, Location, divergence, first_difference, start

NEW = "new"  # the ledger part of tokens no earlier request had sent
EVICTED_TENANT = "hooli"  # its requests keep the `5m` retention class (the gateway's config), so they cannot expire
# Every tenant a kind sends as (each gets an API key).
TENANTS = ("acme", "globex", "umbrella", "stark", "wayne", "brief", EVICTED_TENANT, "initech", "filler")


@dataclass(frozen=True, slots=True)
class Truth:
    """What must be recorded: the miss reason, the location, the ledger part carrying the tokens the cache could not
    serve (`new` or a lost cause) and, for an eviction, the tier."""

    reason: str
    location: Location
    part: str
    tier: str | None = None


@dataclass(frozen=True, slots=True)
class Case:
    """The graded request of one kind: its id, the body sent and the truth."""

    kind: str
    tenant: str
    request_id: str
    body: dict[str, Any]
    truth: Truth
    problem: str | None = None  # the injection could not be made (say, an answer with nothing to rewrite)


def _acme(ctx: Context, **changes: Any) -> Conversation:
    return ctx.conversation("acme", m.SYSTEM, m.TOOLS, **changes)


def _graded(ctx: Context, kind: str, conv: Conversation, body: dict[str, Any], reason: str, part: str,
            reference: dict[str, Any] | None = None, location: Location | None = None,
            tier: str | None = None, problem: str | None = None) -> Case:
    """Send `body` for the conversation's tenant after a think time; the truth's location is `location`, else the
    divergence from `reference`."""
    ctx.think()
    reply = ctx.send(conv.tenant, body, conv.session)
    where = location if location is not None else divergence(reference or {}, body)
    return Case(kind, conv.tenant, reply.request_id, body, Truth(reason, where, part, tier), problem)


def _next_turn(ctx: Context, kind: str, conv: Conversation, reason: str = "hit", part: str = NEW,
               change: Callable[[Conversation], None] | None = None, **body_changes: Any) -> Case:
    """The conversation's next turn, after `change` to what it had sent and with `body_changes`, graded against what
    the cache held."""
    reference = conv.body()
    if change is not None:
        change(conv)
    conv.messages.append({"role": "user", "content": m.FOLLOW_UPS[0]})
    return _graded(ctx, kind, conv, conv.body(**body_changes), reason, part, reference)


def next_turn(ctx: Context) -> Case:
    conv = _acme(ctx)
    conv.turn(ctx.opening())
    return _next_turn(ctx, "next_turn", conv)


def shared_prefix(ctx: Context) -> Case:
    """A new conversation of the tenant: the tools and system prompt were cached by its other conversations."""
    earlier = _acme(ctx)
    earlier.turn(ctx.opening())
    conv = _acme(ctx)
    conv.messages.append({"role": "user", "content": ctx.opening()})
    return _graded(ctx, "shared_prefix", conv, conv.body(), "hit", NEW, earlier.body())


def model_alias(ctx: Context) -> Case:
    conv = _acme(ctx)
    conv.turn(ctx.opening())
    return _next_turn(ctx, "model_alias", conv, model=m.ALIAS_MODEL)


def idle_within_ttl(ctx: Context) -> Case:
    conv = _acme(ctx)
    conv.turn(ctx.opening())
    ctx.sender.pause(ctx.ttl_s * 0.4)
    return _next_turn(ctx, "idle_within_ttl", conv)


def system_changed(ctx: Context) -> Case:
    conv = _acme(ctx)
    conv.turn(ctx.opening())

    def edit(conv: Conversation) -> None:
        conv.messages[0]["content"] = m.EDITED_SYSTEM

    return _next_turn(ctx, "system_changed", conv, "system_changed", "system_changed", edit)


def tools_changed(ctx: Context) -> Case:
    conv = _acme(ctx)
    conv.turn(ctx.opening())

    def edit(conv: Conversation) -> None:
        conv.tools[1]["function"]["description"] = "Book a repair slot for any day of the week."

    return _next_turn(ctx, "tools_changed", conv, "tools_changed", "tools_changed", edit)


def reordered_tools(ctx: Context) -> Case:
    conv = _acme(ctx)
    conv.turn(ctx.opening())

    def reorder(conv: Conversation) -> None:
        conv.tools = [conv.tools[1], conv.tools[0], conv.tools[2]]

    return _next_turn(ctx, "reordered_tools", conv, "reordered", "reordered", reorder)


def volatile_value(ctx: Context) -> Case:
    conv = ctx.conversation("globex", m.STAMPED_SYSTEM.format(stamp=m.stamp(3)), m.TOOLS)
    conv.turn(ctx.opening())

    def restamp(conv: Conversation) -> None:
        conv.messages[0]["content"] = m.STAMPED_SYSTEM.format(stamp=m.stamp(9))

    return _next_turn(ctx, "volatile_value", conv, "volatile_value", "volatile_value", restamp)


def history_compacted(ctx: Context) -> Case:
    conv = _acme(ctx)
    conv.turn(ctx.opening())
    ctx.think()
    conv.turn(m.FOLLOW_UPS[1])
    reference = conv.body()
    conv.messages[1:5] = [{"role": "user", "content": m.SUMMARY}]
    conv.messages.append({"role": "user", "content": m.FOLLOW_UPS[2]})
    return _graded(ctx, "history_compacted", conv, conv.body(), "messages_changed", "messages_changed", reference)


def user_message_edited(ctx: Context) -> Case:
    conv = _acme(ctx)
    conv.turn(ctx.opening())
    ctx.think()
    conv.turn(m.FOLLOW_UPS[1])

    def edit(conv: Conversation) -> None:
        conv.messages[1]["content"] = m.edit_user_message(conv.messages[1]["content"])

    return _next_turn(ctx, "user_message_edited", conv, "messages_changed", "messages_changed", edit)


def _answer_rewritten(ctx: Context, kind: str, rewrite: Callable[[str], str], **first: Any) -> Case:
    conv = _acme(ctx)
    conv.turn(ctx.opening(), **first)
    reference = conv.body()
    answer = conv.messages[-1]
    original = answer["content"] or ""
    answer["content"] = rewrite(original)
    problem = None if answer["content"] != original else f"the answer {original!r} had nothing to rewrite"
    conv.messages.append({"role": "user", "content": m.FOLLOW_UPS[0]})
    return _graded(ctx, kind, conv, conv.body(), "answer_rewritten", "answer_rewritten", reference, problem=problem)


def answer_whitespace(ctx: Context) -> Case:
    return _answer_rewritten(ctx, "answer_whitespace", m.with_whitespace_changed)


def answer_truncated(ctx: Context) -> Case:
    return _answer_rewritten(ctx, "answer_truncated", m.truncated)


def answer_reasoning_stripped(ctx: Context) -> Case:
    return _answer_rewritten(ctx, "answer_reasoning_stripped", m.without_reasoning,
                             response_format=m.REASONING_FORMAT, max_tokens=REASONED_TOKENS)


def tool_arguments(ctx: Context) -> Case:
    conv = _acme(ctx)
    conv.call_tool(ctx.opening())
    reference = conv.body()
    calls = conv.messages[-1].get("tool_calls") or []
    for call in calls:
        call["function"]["arguments"] = m.reserialized(call["function"]["arguments"])
    conv.tool_result(_tool_result())
    problem = None if calls else "the answer called no tool"
    return _graded(ctx, "tool_arguments", conv, conv.body(), "answer_rewritten", "answer_rewritten", reference,
                   problem=problem)


def tool_result_reordered(ctx: Context) -> Case:
    conv = _acme(ctx)
    conv.call_tool(ctx.opening())
    conv.tool_result(_tool_result())
    ctx.think()
    conv.turn()
    reference = conv.body()
    result = conv.messages[-2]
    result["content"] = m.keys_reordered(result["content"])
    problem = None if conv.messages[2].get("tool_calls") else "the answer called no tool"
    conv.messages.append({"role": "user", "content": m.FOLLOW_UPS[0]})
    return _graded(ctx, "tool_result_reordered", conv, conv.body(), "reordered", "reordered", reference,
                   problem=problem)


def _tool_result() -> str:
    return json.dumps(m.TOOL_RESULT)


def model_changed(ctx: Context) -> Case:
    """The next turn sent to another model name, routed to the other engine (the pair's first request goes there)."""
    conv = _acme(ctx)
    conv.turn(ctx.opening())
    conv.messages.append({"role": "user", "content": m.FOLLOW_UPS[0]})
    body = conv.body(model=m.PAIR_MODEL)
    where = Location(MODEL, first_difference(m.PAIR_MODEL, m.MAIN_MODEL))
    return _graded(ctx, "model_changed", conv, body, "model_changed", "model_changed", location=where)


def routed_away(ctx: Context) -> Case:
    """Round robin over the pair: the second turn goes to the replica that did not serve the first."""
    conv = ctx.conversation("umbrella", m.SYSTEM, m.TOOLS, model=m.PAIR_MODEL)
    conv.turn(ctx.opening())
    conv.messages.append({"role": "user", "content": m.FOLLOW_UPS[0]})
    body = conv.body()
    return _graded(ctx, "routed_away", conv, body, "routed_away", "routed_away", location=start(body))


def another_tenant(ctx: Context) -> Case:
    """Another tenant sends a prompt the first tenant has cached, word for word. Tenants are isolated: to the gateway
    this is the tenant's first time (`new_prefix`, every token new), whatever another tenant's cache holds."""
    owner = _acme(ctx)
    owner.turn(ctx.opening())
    owner.messages.append({"role": "user", "content": m.FOLLOW_UPS[0]})
    body = owner.body()
    ctx.send(owner.tenant, body, owner.session)
    other = ctx.conversation("stark", m.SYSTEM, m.TOOLS)
    return _graded(ctx, "another_tenant", other, body, "new_prefix", NEW, location=start(body))


def new_prefix(ctx: Context) -> Case:
    conv = ctx.conversation("wayne", m.SYSTEM, m.TOOLS)
    conv.messages.append({"role": "user", "content": ctx.opening()})
    body = conv.body()
    return _graded(ctx, "new_prefix", conv, body, "new_prefix", NEW, location=start(body))


def below_page(ctx: Context) -> Case:
    """Two prompts sharing an opening shorter than one cache page: nothing of it can be matched."""
    first = ctx.conversation("brief", m.SHORT_SYSTEMS[0])
    first.turn("Hi there")
    conv = ctx.conversation("brief", m.SHORT_SYSTEMS[1])
    conv.messages.append({"role": "user", "content": "Hi there"})
    return _graded(ctx, "below_page", conv, conv.body(), "below_page", "page_alignment", first.body())


def evicted(ctx: Context, fillers: int = 5) -> Case:
    """The conversation's prefix pushed out of the small pool by another tenant's prompts, then its next turn."""
    conv = ctx.conversation(EVICTED_TENANT, m.SYSTEM, m.TOOLS)
    conv.turn(ctx.opening())
    for n in range(fillers):
        ctx.send("filler", {"model": m.MAIN_MODEL, "max_tokens": 1, "temperature": 0,
                            "messages": [{"role": "user", "content": m.filler(n)}]})
    conv.messages.append({"role": "user", "content": m.FOLLOW_UPS[0]})
    body = conv.body()
    return _graded(ctx, "evicted", conv, body, "evicted", "evicted", location=start(body), tier="device")


def expired(ctx: Context) -> Case:
    """The next turn after an idle time past the engines' TTL."""
    conv = ctx.conversation("initech", m.SYSTEM, m.TOOLS)
    conv.turn(ctx.opening())
    ctx.sender.pause(ctx.ttl_s + 3.0)
    conv.messages.append({"role": "user", "content": m.FOLLOW_UPS[0]})
    body = conv.body()
    return _graded(ctx, "expired", conv, body, "expired", "expired", location=start(body))


# In the order they run: the pair's first request is model_changed's (to the second engine); eviction and expiry last.
KINDS: dict[str, Callable[[Context], Case]] = {
    "next_turn": next_turn,
    "shared_prefix": shared_prefix,
    "model_alias": model_alias,
    "idle_within_ttl": idle_within_ttl,
    "system_changed": system_changed,
    "tools_changed": tools_changed,
    "reordered_tools": reordered_tools,
    "volatile_value": volatile_value,
    "history_compacted": history_compacted,
    "user_message_edited": user_message_edited,
    "answer_whitespace": answer_whitespace,
    "answer_truncated": answer_truncated,
    "answer_reasoning_stripped": answer_reasoning_stripped,
    "tool_arguments": tool_arguments,
    "tool_result_reordered": tool_result_reordered,
    "model_changed": model_changed,
    "routed_away": routed_away,
    "another_tenant": another_tenant,
    "new_prefix": new_prefix,
    "below_page": below_page,
    "evicted": evicted,
    "expired": expired,
}


def play(ctx: Context, kinds: list[str] | None = None) -> list[Case]:
    """Run `kinds` (default: all, in `KINDS` order) and return their graded requests. A kind whose requests fail
    (`RuntimeError`: the gateway answered an error) is returned with the error as its problem and no request."""
    cases = []
    for name in kinds or list(KINDS):
        try:
            cases.append(KINDS[name](ctx))
        except RuntimeError as exc:
            cases.append(Case(name, "", "", {}, Truth("", Location("", 0), ""), f"it could not be played: {exc}"))
    return cases

