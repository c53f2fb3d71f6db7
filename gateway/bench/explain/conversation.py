"""One agent conversation as a client keeps it: the messages so far, each answer appended as it came back, and the
request each turn sends. The requests go through a `Sender` (the gateway, or a stand-in in tests)."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.bench.explain.material import MAIN_MODEL, OPENINGS

ANSWER_TOKENS = 12  # a short answer keeps each turn's prompt small
TOOL_CALL_TOKENS = 32
REASONED_TOKENS = 64
# Tenants whose client names each conversation (an agent framework with session ids); the others send none.
SESSION_TENANTS = frozenset({"acme", "globex"})


@dataclass(frozen=True, slots=True)
class Reply:
    """What came back for one request: its id (`x-request-id`) and the assistant message as returned (`role`,
    `content`, and `tool_calls` when the answer called a tool)."""

    request_id: str
    message: dict[str, Any]


class Sender(Protocol):
    """Sends one chat request for a tenant (naming its conversation when `session` is given, as the
    `x-prefixscope-session` header) and returns the reply; `pause` waits (think time, idle time)."""

    def send(self, tenant: str, body: dict[str, Any], session: str | None = None) -> Reply: ...

    def pause(self, seconds: float) -> None: ...


@dataclass
class Context:
    """What the kinds share: the sender, a seeded random source for think times, the engines' idle TTL (seconds),
    the think-time range, and the openings handed out so far."""

    sender: Sender
    ttl_s: float
    think_s: tuple[float, float] = (0.2, 1.0)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    openings_used: int = 0
    conversations: int = 0
    sent: list[str] = field(default_factory=list)  # every request id, in order

    def think(self) -> None:
        self.sender.pause(self.rng.uniform(*self.think_s))

    def send(self, tenant: str, body: dict[str, Any], session: str | None = None) -> Reply:
        reply = self.sender.send(tenant, copy.deepcopy(body), session)
        self.sent.append(reply.request_id)
        return reply

    def conversation(self, tenant: str, system: str, tools: list[dict[str, Any]] | None = None,
                     model: str = MAIN_MODEL) -> Conversation:
        """A new conversation; the tenants in `SESSION_TENANTS` name it (`session`), the others leave the gateway to
        link its turns by content."""
        self.conversations += 1
        session = f"{tenant}-session-{self.conversations}" if tenant in SESSION_TENANTS else None
        return Conversation(self, tenant, model, copy.deepcopy(tools), [{"role": "system", "content": system}],
                            session)

    def opening(self) -> str:
        """The next conversation's first user message (each conversation gets its own)."""
        text = OPENINGS[self.openings_used % len(OPENINGS)]
        self.openings_used += 1
        return text


@dataclass
class Conversation:
    """A conversation's state. `body()` is the request as it would be sent now; `turn` sends it and appends the
    answer, so that afterwards `body()` is also what the cache holds (the prompt and its answer)."""

    context: Context
    tenant: str
    model: str
    tools: list[dict[str, Any]] | None
    messages: list[dict[str, Any]]
    session: str | None = None  # the conversation id the client sends, if any
    last: Reply | None = None

    def body(self, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": copy.deepcopy(self.messages),
                                "max_tokens": ANSWER_TOKENS, "temperature": 0}
        if self.tools:
            body["tools"] = copy.deepcopy(self.tools)
        return {**body, **extra}

    def turn(self, user: str | None = None, **extra: Any) -> Reply:
        """Append `user` (when given), send, append the answer; returns the reply."""
        if user is not None:
            self.messages.append({"role": "user", "content": user})
        reply = self.context.send(self.tenant, self.body(**extra), self.session)
        self.messages.append(answer_message(reply.message))
        self.last = reply
        return reply

    def call_tool(self, user: str, name: str = "lookup_order") -> Reply:
        """A turn whose answer is a call of tool `name` (the request forces it)."""
        choice = {"type": "function", "function": {"name": name}}
        return self.turn(user, tool_choice=choice, max_tokens=TOOL_CALL_TOKENS)

    def tool_result(self, content: str) -> None:
        """Append the result of the last answer's first tool call."""
        calls = self.messages[-1].get("tool_calls") or [{}]
        self.messages.append({"role": "tool", "tool_call_id": calls[0].get("id") or "call_0", "content": content})


def answer_message(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as a client re-sends it: role, content, and the tool calls when there are any."""
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = [
            {"id": call.get("id"), "type": "function",
             "function": {"name": call["function"]["name"], "arguments": call["function"].get("arguments") or "{}"}}
            for call in message["tool_calls"]
        ]
    elif kept["content"] is None:
        kept["content"] = ""
    return kept
