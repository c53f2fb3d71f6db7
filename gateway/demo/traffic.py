"""The demo tenants and the requests they send, as a client would send them (before the gateway touches them).

- `acme-support`: a support bot with a few long system prompts, multi-turn chats, now and then a client that sends
  CRLF line endings (the `newlines` rule undoes it) or a revised system prompt;
- `globex-agents`: agents with a dozen tool schemas, sent with their keys in another order now and then (normalized)
  and with the tools themselves in one of a few other orders (not normalized: `tool_order` is off for this tenant),
  a schema version that changes; tool calls and tool results in the conversation;
- `initech-rag`: retrieval-augmented questions over many documents, each a new single-turn request;
- `umbrella-timestamps`: the current time and a request id at the top of the system prompt (hoisting is off);
- `hooli-batch`: completions over documents on a hosted API that reports no cached tokens.

Every text derives from the seed: the same seed gives the same requests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from gateway.config.tenant import SEMANTIC_RULES, TenantSettings

_WORDS: Final = (
    "account order refund invoice shipping policy customer ticket priority escalate warranty replacement billing "
    "subscription cancel upgrade device firmware reset password verify identity address delivery tracking return "
    "label damaged missing item partial credit store exchange holiday hours region tax receipt payment card bank "
    "transfer pending approved declined retry support agent handoff summary apologize clarify confirm politely "
    "never promise always document internal notes customer-facing tone concise accurate"
).split()


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(8, 18))]
    return " ".join(words).capitalize() + "."


def _paragraphs(rng: random.Random, chars: int) -> str:
    lines: list[str] = []
    size = 0
    while size < chars:
        line = " ".join(_sentence(rng) for _ in range(rng.randint(2, 5)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


@dataclass(frozen=True)
class TenantProfile:
    """A demo tenant: its share of traffic, the models it calls, its settings and its request shape."""

    name: str
    weight: float
    models: tuple[str, ...]
    settings: TenantSettings
    endpoint: str = "chat.completions"
    continue_rate: float = 0.0  # chance a request continues an open conversation
    stream_rate: float = 0.6


# fmt: off
TENANTS: Final = (
    TenantProfile("acme-support", 0.35, ("smollm2",),
                  TenantSettings(store_prompt_text=True), continue_rate=0.7),
    TenantProfile("globex-agents", 0.25, ("smollm2", "llama-3.1-8b-instruct"),
                  TenantSettings(rules=frozenset({"newlines", "tool_schema_key_order"})), continue_rate=0.6),
    TenantProfile("initech-rag", 0.2, ("smollm2", "qwen2.5-7b-instruct"), TenantSettings()),
    TenantProfile("umbrella-timestamps", 0.12, ("smollm2", "llama-3.1-8b-instruct"),
                  TenantSettings(rules=frozenset(SEMANTIC_RULES)), continue_rate=0.3),
    TenantProfile("hooli-batch", 0.08, ("gpt-4o-mini",), TenantSettings(), endpoint="completions",
                  stream_rate=0.0),
)
# fmt: on


def _tool(rng: random.Random, index: int, version: int) -> dict[str, Any]:
    name = f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}_{index}".replace("-", "_")
    params = {
        f"{rng.choice(_WORDS)}_{k}".replace("-", "_"): {"type": rng.choice(("string", "integer", "boolean")),
                                                        "description": _sentence(rng)}
        for k in range(rng.randint(2, 5))
    }
    description = _sentence(rng) + (f" Revised in schema v{version}." if version else "")
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": params, "required": sorted(params)[:1]},
    }}


def _keys_reversed(value: Any) -> Any:
    """The same JSON with every object's keys in reverse order (a client that builds its schemas differently)."""
    if isinstance(value, dict):
        return {key: _keys_reversed(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_keys_reversed(item) for item in value]
    return value


@dataclass
class _Conversation:
    prefix: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0


class Traffic:
    """Builds each tenant's next request body from one seeded random stream."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(f"traffic/{seed}")
        self._seed = seed
        self._texts: dict[str, str] = {}
        self._tools: dict[tuple[int, int], list[dict[str, Any]]] = {}
        self._last: dict[str, dict[str, Any]] = {}
        self._open: dict[str, list[_Conversation]] = {profile.name: [] for profile in TENANTS}

    def _text(self, key: str, chars: int) -> str:
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = _paragraphs(random.Random(f"{self._seed}/{key}"), chars)
        return text

    def _zipf(self, count: int) -> int:
        return min(int(self.rng.paretovariate(1.2)) - 1, count - 1)

    def request(self, profile: TenantProfile, model: str, now: datetime) -> dict[str, Any]:
        """The next request body of `profile`'s tenant, as its client sends it at `now`."""
        last = self._last.get(profile.name)
        if last is not None and last["model"] == model and self.rng.random() < 0.03:
            return last  # a client retrying the same request
        if profile.endpoint == "completions":
            body = self._completion(model)
        else:
            body = self._chat(profile, model, now)
        self._last[profile.name] = body
        return body

    def _chat(self, profile: TenantProfile, model: str, now: datetime) -> dict[str, Any]:
        conversations = self._open[profile.name]
        rng = self.rng
        if conversations and rng.random() < profile.continue_rate:
            conversation = conversations[rng.randrange(len(conversations))]
            conversation.turns += 1
            if conversation.turns >= 6:
                conversations.remove(conversation)
            conversation.messages += self._reply(profile) + [self._question(profile)]
        else:
            conversation = _Conversation(self._zipf({"acme-support": 8, "globex-agents": 10}.get(profile.name, 12)))
            conversation.messages = [self._question(profile)]
            conversations.append(conversation)
            del conversations[:-20]
        body: dict[str, Any] = {"model": model, "messages": [self._system(profile, conversation.prefix, now)]}
        body["messages"] += conversation.messages
        if profile.name == "globex-agents":
            body["tools"] = self._agent_tools(conversation.prefix)
        return body

    def _system(self, profile: TenantProfile, prefix: int, now: datetime) -> dict[str, str]:
        rng = self.rng
        name = profile.name
        if name == "acme-support":
            version = rng.randrange(3) if rng.random() < 0.04 else 0
            text = self._text(f"{name}/system/{prefix}", 1600 + 400 * prefix)
            if version:  # a revised paragraph partway through
                cut = len(text) // (version + 1)
                update = f"Policy update {version}: " + self._text(f"{name}/update/{version}", 200)
                text = text[:cut] + update + text[cut:]
            if rng.random() < 0.1:
                text = text.replace("\n", "\r\n")  # a client on another platform
        elif name == "umbrella-timestamps":
            stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
            header = f"Current time: {stamp}. Request {rng.getrandbits(64):016x}.\n"
            text = header + self._text(f"{name}/{prefix}", 1500)
        elif name == "globex-agents":
            text = self._text(f"{name}/system", 600)
        else:
            text = self._text(f"{name}/system", 1200)
        return {"role": "system", "content": text}

    def _agent_tools(self, agent: int) -> list[dict[str, Any]]:
        rng = self.rng
        version = rng.randrange(1, 3) if rng.random() < 0.08 else 0
        tools = self._tools.get((agent, version))
        if tools is None:
            source = random.Random(f"{self._seed}/tools/{agent}")
            tools = [_tool(source, index, 0) for index in range(12)]
            if version:
                tools[7] = _tool(random.Random(f"{self._seed}/tools/{agent}/7"), 7, version)
            self._tools[(agent, version)] = tools
        tools = list(tools)
        if rng.random() < 0.25:  # one of a few recurring orders: two tools swapped
            first = rng.randrange(4)
            tools[first], tools[first + 6] = tools[first + 6], tools[first]
        if rng.random() < 0.3:
            tools = _keys_reversed(tools)
        return tools

    def _question(self, profile: TenantProfile) -> dict[str, Any]:
        rng = self.rng
        if profile.name == "initech-rag":
            docs = sorted({self._zipf(200) for _ in range(3)})
            context = "\n\n".join(f"[doc {doc}]\n" + self._text(f"doc/{doc}", 700) for doc in docs)
            return {"role": "user", "content": f"Context:\n{context}\n\nQuestion: {_sentence(rng)}"}
        return {"role": "user", "content": _sentence(rng) + " " + _sentence(rng)}

    def _reply(self, profile: TenantProfile) -> list[dict[str, Any]]:
        rng = self.rng
        if profile.name == "globex-agents" and rng.random() < 0.6:
            call_id = f"call_{rng.getrandbits(48):012x}"
            arguments = '{"query": "%s", "limit": %d}' % (rng.choice(_WORDS), rng.randint(1, 20))
            call = {"id": call_id, "type": "function", "function": {"name": "search", "arguments": arguments}}
            return [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call_id, "content": _paragraphs(rng, 300)},
                {"role": "assistant", "content": _sentence(rng)},
            ]
        return [{"role": "assistant", "content": " ".join(_sentence(rng) for _ in range(rng.randint(1, 4)))}]

    def _completion(self, model: str) -> dict[str, Any]:
        document = self._text(f"hooli/doc/{self._zipf(30)}", 2000)
        return {"model": model, "prompt": f"Summarize the following document.\n\n{document}\n\nSummary:"}
