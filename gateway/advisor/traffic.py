"""Agent-session traffic with the usual client habits, for `prefixscope bench advise` and the advisor's tests.

Each session is one agent conversation of `turns` calls. Every call sends the whole conversation so far, and:
- the system prompt starts with a request id (a UUID) and the current time (ISO 8601), then a long fixed text
  (`volatile=False` leaves the two out);
- the tools are serialised in a different order, with their keys in a different order, on every call;
- some user turns use CRLF line endings.

The assistant turns are fixed texts, so that every tenant replays byte-identical conversations apart from the values
that change per call. Deterministic for a seed.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

SYSTEM_TEXT = (
    "You are the operations assistant of a regional bicycle repair cooperative. You help the workshop staff plan "
    "repairs, order spare parts, answer members' questions about their bikes and keep the shared calendar tidy. "
    "Always check the parts inventory before promising a repair, prefer the cheapest part that fits, and ask for the "
    "frame size and the wheel diameter when a member asks about tyres, tubes or rims. When a member asks about a "
    "repair that is already booked, look the booking up rather than guessing. Never share a member's address or "
    "phone number with anyone but that member. Keep answers short, friendly and practical, use plain words rather "
    "than trade jargon, and end every answer with the next concrete step the member or the workshop should take."
)
_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "find_booking",
            "description": "Look up a repair booking by member name or booking reference.",
            "parameters": {
                "type": "object",
                "properties": {
                    "member": {"type": "string", "description": "the member's full name"},
                    "reference": {"type": "string", "description": "the booking reference"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "check_inventory",
            "description": "How many of a spare part are in stock, and where in the workshop.",
            "parameters": {
                "type": "object",
                "properties": {
                    "part": {"type": "string", "description": "the part's name or catalogue code"},
                    "size": {"type": "string", "description": "size, when the part comes in several"},
                },
                "required": ["part"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "order_part",
            "description": "Order a spare part from the wholesaler.",
            "parameters": {
                "type": "object",
                "properties": {
                    "part": {"type": "string", "description": "catalogue code"},
                    "quantity": {"type": "integer", "description": "how many"},
                },
                "required": ["part", "quantity"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_repair",
            "description": "Book a repair slot in the shared workshop calendar.",
            "parameters": {
                "type": "object",
                "properties": {
                    "member": {"type": "string", "description": "the member's full name"},
                    "day": {"type": "string", "description": "the day of the repair"},
                    "job": {"type": "string", "description": "what is to be done"},
                },
                "required": ["member", "day", "job"],
            },
        },
    },
]
_USER_TURNS = (
    "My back tyre keeps going flat after a day or two.\nCould you check whether you have tubes in stock?",
    "It is a 28 inch wheel, the frame is a medium.\nThe tyre itself looks fine to me.",
    "Great, please book me in for Thursday afternoon if there is a slot.\nMy name is Robin Vale.",
    "Also, the chain makes a clicking noise when I change gear.\nIs that something you can look at too?",
    "Could you order a new chain in case it needs replacing?\nI would rather not come back twice.",
    "Thanks. One last thing: what should I bring along on Thursday?\nJust the bike, or the old parts too?",
    "I will drop the bike off before lunch.\nPlease call me if the repair costs more than planned.",
)
_ASSISTANT_TURNS = (
    "I will check the inner tubes in stock for you now.",
    "Thanks, a 28 inch tube for a medium frame is in stock.",
    "Booked: Thursday afternoon for Robin Vale, tube replacement.",
    "Yes, we can adjust the derailleur during the same visit.",
    "I have ordered a chain; it arrives before Thursday.",
    "Just the bike is enough; we keep the old parts for recycling.",
)


def _shuffled_keys(value: Any, rng: random.Random) -> Any:
    """`value` with every object's keys in a random order (lists keep their order)."""
    if isinstance(value, dict):
        items = [(key, _shuffled_keys(item, rng)) for key, item in value.items()]
        rng.shuffle(items)
        return dict(items)
    if isinstance(value, list):
        return [_shuffled_keys(item, rng) for item in value]
    return value


def session_requests(
    session: int, turns: int, *, volatile: bool = True, seed: int = 0, start: datetime | None = None
) -> list[list[dict[str, Any]]]:
    """The `messages` and `tools` of each call of one session, as request bodies without the model."""
    if not 1 <= turns <= len(_USER_TURNS):
        raise ValueError(f"turns must be between 1 and {len(_USER_TURNS)}")
    rng = random.Random(f"{seed}-{session}")
    moment = start or datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    bodies = []
    history: list[dict[str, Any]] = []
    for turn in range(turns):
        moment += timedelta(seconds=rng.randint(20, 90))
        system = SYSTEM_TEXT
        if volatile:
            request_id = uuid.UUID(int=rng.getrandbits(128), version=4)
            system = f"Request id: {request_id}\nCurrent time: {moment:%Y-%m-%dT%H:%M:%SZ}\n\n{SYSTEM_TEXT}"
        user = _USER_TURNS[(turn + session) % len(_USER_TURNS)]
        if turn % 2 == 1:
            user = user.replace("\n", "\r\n")
        history.append({"role": "user", "content": user})
        tools = [_shuffled_keys(tool, rng) for tool in _TOOLS]
        rng.shuffle(tools)
        bodies.append({"messages": [{"role": "system", "content": system}, *history], "tools": tools})
        history = [*history, {"role": "assistant", "content": _ASSISTANT_TURNS[turn % len(_ASSISTANT_TURNS)]}]
    return bodies


def interleaved_sessions(
    sessions: int, turns: int, *, volatile: bool = True, seed: int = 0
) -> list[tuple[int, int, dict[str, Any]]]:
    """(session, turn, body) for every call of every session, the sessions taking turns."""
    per_session = [session_requests(s, turns, volatile=volatile, seed=seed) for s in range(sessions)]
    return [(s, t, per_session[s][t]) for t in range(turns) for s in range(sessions)]
