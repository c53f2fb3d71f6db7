"""Which conversation a request belongs to: by the id the client gives, else by content (`docs/conversations.md`).

Per tenant, in memory only, the tracker remembers recent turns under keyed hashes (BLAKE2b keyed with the tenant's
record key, `gateway.record_keys`): an explicit conversation under its keyed id (its latest request, registered when
the request goes upstream, so turns are numbered in the order they were sent), and every answered chat request under
the keyed hash chain of its segments after the model (`gateway.explain.segments`), with the answer the gateway
returned (`gateway.conversations.answer`).

A request extends an earlier one by content when its segments after the model start with that request's segments
and the next segment is an assistant message: the re-sent answer. The longest such run wins; the model may differ.
The re-sent answer is compared with the one returned (`gateway.conversations.rewrite`): a rewrite is recorded and the
turn still links. A request that extends nothing starts a new conversation.

Memory is bounded: `max_turns_per_tenant` and `max_turns` remembered turns (oldest forgotten first), answers held up
to `max_answer_chars` characters in all (and their tool calls, in `returned`, up to `max_turns` calls); a turn is forgotten once the tenant's longest retention class
(`max_cache_retention`: 5m, 1h, or `persistent_s` for persistent) has passed since it was answered. Everything runs
on the event loop after the request went upstream or was answered: nothing delays a request.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from db.retention.costs import CLASS_TTL_S
from gateway.conversations.answer import Answer
from gateway.conversations.ids import ExplicitId
from gateway.conversations.link import ConversationLink
from gateway.conversations.returned import ReturnedCalls
from gateway.conversations.rewrite import answer_rewrite

CONTENT = "content"
DEFAULT_PERSISTENT_S = 86_400.0
_ID_CONTEXT = b"prefixscope/conversation/v1\x00"
_MESSAGE = "message"  # a message segment's kind (`gateway.explain.segments.MESSAGE`)


@dataclass(slots=True, eq=False)
class Turn:
    """One remembered request: where it stands in its conversation, and (once answered) its answer."""

    request_id: str
    conversation_id: str
    turn_index: int
    num_segments: int  # the request's segments, model included
    expires_at: float
    answered_at: float | None = None
    answer: Answer | None = None
    replica: str | None = None  # the replica that answered it (None: unknown, or not a replica set)
    computed_tokens: int | None = None  # its prompt and answer tokens, computed on that replica
    refs: int = 0  # how many index slots hold it


@dataclass(slots=True, eq=False)
class Pending:
    """A request's link as found when it went upstream, kept on its explain context until it is answered."""

    link: ConversationLink
    chain: tuple[bytes, ...]  # keyed chain over the segments after the model
    turn: Turn | None  # its explicit conversation's turn (registered already), else None
    prepared_at: float
    previous: Turn | None = None  # the explicit conversation's latest turn before this one (restored if unanswered)


class _Tenant:
    __slots__ = ("slots",)

    def __init__(self) -> None:
        self.slots: OrderedDict[tuple[str, Any], Turn] = OrderedDict()  # ("e", id) | ("c", chain key) -> turn


class ConversationTracker:
    """Links each request to its conversation. `key_for(tenant)` gives the tenant's record key (32 bytes). Not
    thread-safe: used from the event loop only. Raises ValueError for a bound below 1. `returned` holds the tool calls
    of the answers it remembers (`gateway.conversations.returned`), for the normalization rules."""

    def __init__(
        self,
        key_for: Callable[[str], bytes],
        *,
        max_turns: int = 200_000,
        max_turns_per_tenant: int = 20_000,
        max_answer_chars: int = 50_000_000,
        persistent_s: float = DEFAULT_PERSISTENT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min(max_turns, max_turns_per_tenant, max_answer_chars) < 1 or persistent_s <= 0:
            raise ValueError("the conversation memory bounds must be positive")
        self._key_for = key_for
        self.max_turns = max_turns
        self.max_turns_per_tenant = max_turns_per_tenant
        self.max_answer_chars = max_answer_chars
        self.persistent_s = persistent_s
        self._clock = clock
        self._tenants: dict[str, _Tenant] = {}
        self._order: OrderedDict[tuple[str, str, Any], None] = OrderedDict()  # every slot, oldest first
        self.answer_chars = 0
        self.returned = ReturnedCalls(key_for, max_entries=max_turns, clock=clock)

    def __len__(self) -> int:
        return len(self._order)

    # -- linking -------------------------------------------------------------------------------------------------

    def prepare(self, context: Any) -> None:
        """Find the request's conversation when it goes upstream (`context`: `gateway.explain.ExplainContext`, its
        segments computed) and keep it on `context.conversation`."""
        now = self._clock()
        self._expire(now)
        tenant, key = context.tenant, self._key_for(context.tenant)
        segments = context.segments  # `gateway.explain.segments.PromptSegments`, None when it could not be segmented
        chain = self._chain(key, segments) if segments is not None and _messages(context) is not None else ()
        parent, rewrite_at = self._content_parent(context, chain, now)
        explicit: ExplicitId | None = context.explicit_id
        turn = None
        if explicit is not None:
            given = f"{explicit.source}\x00{explicit.value}".encode("utf-8", "surrogatepass")
            conversation_id = _keyed_id(key, given)
            last = self._get(tenant, ("e", conversation_id), now)
            link = ConversationLink(conversation_id, explicit.source, 1 if last is None else last.turn_index + 1)
            if last is not None:
                link = replace(link, parent_request_id=last.request_id, idle_s=_idle(now, last),
                               parent_replica=last.replica, parent_computed_tokens=last.computed_tokens)
                if parent is last:
                    link = self._extension(link, context, segments, parent, rewrite_at)
            turn = Turn(context.request_id, conversation_id, link.turn_index, len(segments.segments) if segments
                        else 0, self._expiry(context, now))
            self._put(tenant, ("e", conversation_id), turn)
        elif parent is not None:
            link = _child(parent, _idle(now, parent))
            link = self._extension(link, context, segments, parent, rewrite_at)
        else:
            link = ConversationLink(_keyed_id(key, b"content\x00" + str(context.request_id).encode()), CONTENT, 1)
        context.conversation = Pending(link, chain, turn, now, None if explicit is None else last)

    def finish(self, context: Any, *, answered: bool) -> ConversationLink | None:
        """The request's link, remembered as a turn later requests can extend; None when it was never prepared or not
        `answered` (the upstream's 2xx answer went to the client): a request the gateway refused or the upstream did
        not answer is no turn of any conversation, and its explicit conversation's latest turn is the one before."""
        pending: Pending | None = getattr(context, "conversation", None)
        if pending is None:
            return None
        if not answered:
            self._withdraw(context.tenant, pending)
            return None
        now = self._clock()
        link = pending.link
        if link.source == CONTENT and link.turn_index == 1 and pending.chain:
            # Its parent may have been answered after this request went upstream: look again.
            parent, rewrite_at = self._content_parent(context, pending.chain, now)
            if parent is not None:
                link = _child(parent, _idle(pending.prepared_at, parent))
                link = self._extension(link, context, context.segments, parent, rewrite_at)
                pending.link = link
        if pending.turn is None and not pending.chain:
            return link  # nothing a later request could follow
        turn = pending.turn
        if turn is None:
            turn = Turn(context.request_id, link.conversation_id, link.turn_index, len(context.segments.segments),
                        self._expiry(context, now))
        turn.answered_at, turn.expires_at = now, self._expiry(context, now)
        turn.replica, turn.computed_tokens = getattr(context, "replica", None), getattr(context, "computed_tokens", None)
        if pending.chain:  # a chat request: later requests can extend it by content
            capture = getattr(context, "answer", None)
            answer = capture.answer() if capture is not None else None
            self._hold_answer(turn, answer)
            if answer is not None and answer.tool_calls:
                self.returned.remember(context.tenant, answer.tool_calls, turn.expires_at)
            self._put(context.tenant, ("c", pending.chain[-1]), turn)
        return link

    def _content_parent(self, context: Any, chain: tuple[bytes, ...], now: float) -> tuple[Turn | None, int]:
        """The latest turn this request extends and the index of the re-sent answer's segment (or None, -1)."""
        if not chain:
            return None, -1
        messages = _messages(context)
        segments = context.segments.segments
        for index in range(len(segments) - 1, 1, -1):  # segment 0 is the model; the answer follows 1+ segments
            if not _is_assistant(segments[index], messages):
                continue
            turn = self._get(context.tenant, ("c", chain[index - 2]), now)
            if turn is not None and turn.num_segments == index:
                return turn, index
        return None, -1

    @staticmethod
    def _extension(link: ConversationLink, context: Any, segments: Any, parent: Turn, at: int) -> ConversationLink:
        """`link` with where the new part starts and how the re-sent answer was rewritten."""
        rewrite, as_returned = None, False
        if parent.answer is not None and at >= 0:
            segment = segments.segments[at]
            message = _message_of(segment, _messages(context))
            rewrite = answer_rewrite(parent.answer, message, segment.name, at)
            as_returned = rewrite is None and isinstance(message, dict)
        return replace(link, new_from_segment=at + 1, answer_rewrite=rewrite, answer_as_returned=as_returned)

    def _withdraw(self, tenant: str, pending: Pending) -> None:
        """Forget an unanswered request's explicit turn: its conversation's latest turn is the previous one again
        (unless a later request of that conversation was registered since)."""
        turn = pending.turn
        if turn is None:
            return
        state = self._tenants.get(tenant)
        slot = ("e", turn.conversation_id)
        if state is None or state.slots.get(slot) is not turn:
            return
        self._drop(tenant, slot)
        previous = pending.previous
        if previous is not None and previous.expires_at > self._clock():
            self._put(tenant, slot, previous)

    # -- memory --------------------------------------------------------------------------------------------------

    @staticmethod
    def _chain(key: bytes, segments: Any) -> tuple[bytes, ...]:
        chain, previous = [], b""
        for segment in segments.segments[1:]:
            previous = hashlib.blake2b(previous + segment.digest.to_bytes(8, "big"), key=key, digest_size=16).digest()
            chain.append(previous)
        return tuple(chain)

    def _expiry(self, context: Any, now: float) -> float:
        longest = getattr(context.settings, "max_cache_retention", "persistent")
        ttl = CLASS_TTL_S.get(longest)
        return now + (ttl if ttl is not None else self.persistent_s)

    def _get(self, tenant: str, slot: tuple[str, Any], now: float) -> Turn | None:
        state = self._tenants.get(tenant)
        turn = None if state is None else state.slots.get(slot)
        if turn is not None and turn.expires_at <= now:
            self._drop(tenant, slot)
            return None
        return turn

    def _put(self, tenant: str, slot: tuple[str, Any], turn: Turn) -> None:
        if tenant in self._tenants and slot in self._tenants[tenant].slots:
            self._drop(tenant, slot)
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant()
        state.slots[slot] = turn
        turn.refs += 1
        self._order[(tenant, *slot)] = None
        while len(state.slots) > self.max_turns_per_tenant:
            self._drop(tenant, next(iter(state.slots)))
        while len(self._order) > self.max_turns or self.answer_chars > self.max_answer_chars:
            oldest = next(iter(self._order))
            self._drop(oldest[0], oldest[1:])

    def _hold_answer(self, turn: Turn, answer: Answer | None) -> None:
        if turn.answer is not None:
            self.answer_chars -= turn.answer.chars
        if answer is not None and answer.chars > self.max_answer_chars:
            answer = None
        turn.answer = answer
        if answer is not None:
            self.answer_chars += answer.chars

    def _drop(self, tenant: str, slot: tuple[str, Any]) -> None:
        state = self._tenants[tenant]
        turn = state.slots.pop(slot)
        self._order.pop((tenant, *slot), None)
        turn.refs -= 1
        if turn.refs <= 0 and turn.answer is not None:
            self.answer_chars -= turn.answer.chars
            turn.answer = None
        if not state.slots:
            del self._tenants[tenant]

    def _expire(self, now: float) -> None:
        """Forget the oldest turns while they have expired (each tenant's turns expire in the order they came)."""
        while self._order:
            tenant, *slot = next(iter(self._order))
            turn = self._tenants[tenant].slots[tuple(slot)]
            if turn.expires_at > now:
                return
            self._drop(tenant, tuple(slot))


def _keyed_id(key: bytes, data: bytes) -> str:
    return "cv_" + hashlib.blake2b(_ID_CONTEXT + data, key=key, digest_size=12).hexdigest()


def _child(parent: Turn, idle_s: float | None) -> ConversationLink:
    """The link of a turn that extends `parent` by content."""
    return ConversationLink(parent.conversation_id, CONTENT, parent.turn_index + 1, parent.request_id, idle_s,
                            parent_replica=parent.replica, parent_computed_tokens=parent.computed_tokens)


def _idle(now: float, parent: Turn) -> float | None:
    return None if parent.answered_at is None else max(0.0, now - parent.answered_at)


def _messages(context: Any) -> list[Any] | None:
    messages = context.body.get("messages") if isinstance(context.body, dict) else None
    return messages if isinstance(messages, list) else None


def _message_of(segment: Any, messages: list[Any] | None) -> Any:
    if segment.kind != _MESSAGE or messages is None or not segment.name.startswith("messages["):
        return None
    index = int(segment.name[9:-1])
    return messages[index] if index < len(messages) else None


def _is_assistant(segment: Any, messages: list[Any] | None) -> bool:
    message = _message_of(segment, messages)
    return isinstance(message, dict) and message.get("role") == "assistant"
