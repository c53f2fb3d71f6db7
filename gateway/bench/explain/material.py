"""The text of the generated agent conversations: an order-support agent's tools and system prompt, the users'
questions (each conversation opens with its own first word, so conversations share nothing past the system prompt),
follow-ups, tool results and the edits the kinds inject."""

from __future__ import annotations

import json
import re
from typing import Any

MAIN_MODEL = "smollm2"  # the default upstream: one engine
ALIAS_MODEL = "SmolLM2-135M-Instruct"  # another name of the same model, routed to the same engine
PAIR_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # routed to the replica pair (round robin over both engines)


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": properties}}}


TOOLS = [
    _tool("lookup_order", "Find an order by its id.", {"order_id": {"type": "string"}}),
    _tool("book_repair", "Book a repair slot at the shop.", {"day": {"type": "string"}}),
    _tool("refund", "Refund an order to the card it was paid with.", {"order_id": {"type": "string"}}),
]

SYSTEM = (
    "You are the support agent of a bicycle shop. Answer questions about orders, repairs and refunds. "
    "Use the tools to look orders up. Be brief, be polite and never invent order numbers."
)
EDITED_SYSTEM = SYSTEM.replace("Be brief, be polite", "Be brief, be friendly")
STAMPED_SYSTEM = "Current time: {stamp}\n" + SYSTEM  # a timestamp atop the system prompt
SHORT_SYSTEMS = (  # two prompts sharing an opening shorter than one 16-token page
    "You are a helpful bot. Answer in French, in one short sentence.",
    "You are a helpful bot. Reply with a haiku about the user's question.",
)

OPENINGS = (  # distinct first letters: no two conversations share a character past the system prompt
    "Are electric bikes serviced at your shop?",
    "Book my bike in for a brake check, please.",
    "Can I return a helmet I bought last week?",
    "Do you repair carbon frames, and how long does it take?",
    "Every invoice I get is wrong, order 8250 too.",
    "For order 9913, send me the tracking link please.",
    "Good morning, can I change the delivery address of order 2290?",
    "Has parcel 2207 left the warehouse yet?",
    "Is the red city bike in stock in size M?",
    "Just checking: which pedals come with the gravel bike?",
    "Kindly refund order 6631, the saddle is too wide.",
    "Lost in transit, says order 7004. What now?",
    "My order 5120 arrived with a broken light.",
    "Now order 1207 is late again, what happened?",
    "Opening hours on Saturday, please?",
    "Perhaps you can tell me which tyres fit a 28 inch rim.",
    "Quick question: what does the two year warranty cover?",
    "Refund status for order 3345?",
    "So why was I charged twice for order 3318?",
    "Tell me where my order 4411 is. It was due on Monday.",
)
FOLLOW_UPS = (
    "Thanks. And how long will that take?",
    "Great, please also check the invoice.",
    "Fine. Is there anything else I should know?",
)
SUMMARY = "(summary) So far the customer asked about an order and got an answer."
TOOL_RESULT = {"order_id": "4411", "status": "shipped", "carrier": "DHL", "eta": "2026-12-03"}

# Answers with a reasoning block: the output is a JSON string holding `<think>...</think>` and then the answer.
REASONING_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "reasoned_answer", "strict": True,
                    "schema": {"type": "string", "pattern": "^<think>[a-z ]{4,16}</think>[A-Za-z ]{4,24}$"}},
}
_REASONING = re.compile(r"<think>.*?</think>", re.DOTALL)


def filler(n: int) -> str:
    """Another tenant's prompt of about 300 tokens, different for each `n` from its first word on."""
    return f"Inventory note {n}: " + " ".join(f"item-{n}-{i} in aisle {i % 7}, bin {i * 3 % 11}." for i in range(20))


def stamp(seconds: int) -> str:
    """An ISO timestamp `seconds` after 2026-12-01T09:00:00Z."""
    minutes, second = divmod(seconds, 60)
    return f"2026-12-01T09:{minutes % 60:02d}:{second:02d}Z"


def edit_user_message(text: str) -> str:
    """The message with a word past its start replaced, as a user correcting an earlier message."""
    words = text.split(" ")
    at = max(1, len(words) // 2)
    words[at] = "really" if words[at] != "really" else "truly"
    return " ".join(words)


def with_whitespace_changed(text: str) -> str:
    """The answer with its whitespace changed and nothing else: a blank line collapsed, else a newline made a space,
    else a space doubled."""
    if "\n\n" in text:
        return text.replace("\n\n", "\n", 1)
    if "\n" in text:
        return text.replace("\n", " ", 1)
    if " " in text:
        return text.replace(" ", "  ", 1)
    return text + "\n"


def truncated(text: str) -> str:
    """The first half of the answer (at least one character kept, at least one cut)."""
    return text[: max(1, len(text) // 2)] if len(text) > 1 else ""


def without_reasoning(text: str) -> str:
    """The answer with its reasoning block removed."""
    return _REASONING.sub("", text, count=1)


def reserialized(arguments: str) -> str:
    """Tool-call arguments as another client would serialize the same JSON value (compact, spaced or indented)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return " " + arguments
    for form in (json.dumps(value, separators=(",", ":")), json.dumps(value), json.dumps(value, indent=1)):
        if form != arguments:
            return form
    return " " + arguments


def keys_reordered(content: str) -> str:
    """A JSON object's text with its keys in reverse order."""
    value = json.loads(content)
    return json.dumps({key: value[key] for key in reversed(list(value))})
