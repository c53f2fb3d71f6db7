"""What the gateway knows about the conversation one request belongs to (`db.ledger` declares the vocabularies)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final


CONVERSATION_FIELDS: Final = (
    "conversation_id",
    "conversation_source",
    "turn_index",
    "parent_request_id",
    "idle_s",
    "answer_rewrite",
    "answer_rewrite_segment",
    "answer_rewrite_char_offset",
)
"""The `RequestRecord` fields a link fills (`ConversationLink.record_fields`); NULL on a request of no conversation."""


@dataclass(frozen=True, slots=True)
class AnswerRewrite:
    """The previous answer, re-sent differently from how the gateway returned it.

    `kind` is one of `db.ledger.ANSWER_REWRITES`; `segment` names the re-sent message (`messages[i]`, as in
    `gateway.explain.segments`), `segment_index` is its index among the request's segments, and `char_offset` is the
    first character (of that segment's text) that differs from the answer as returned.
    """

    kind: str
    segment: str
    segment_index: int
    char_offset: int


@dataclass(frozen=True, slots=True)
class ConversationLink:
    """One request's place in its conversation.

    `conversation_id` is keyed per tenant (never the client's own id in clear); `source` is one of
    `db.ledger.CONVERSATION_SOURCES`; `turn_index` counts from 1. `parent_request_id` and `idle_s` (seconds from the
    parent's answer to this request) are None for a first turn. `new_from_segment` is the index, among the request's
    segments (`gateway.explain.segments.PromptSegments`), of the first segment the parent had not sent: the segments
    before it are the parent's prompt and its answer as re-sent; None for a first turn (or when the request does not
    extend its parent). `answer_rewrite` is set when the re-sent answer differs from the one returned;
    `answer_as_returned` is True when it was compared with the answer held and found as returned (False: rewritten,
    or not compared: a first turn, an answer not held).
    `parent_replica` is the replica that answered the parent (None: unknown, or not a replica set) and
    `parent_computed_tokens` the tokens it computed there (the parent's prompt and answer).
    """

    conversation_id: str
    source: str
    turn_index: int
    parent_request_id: str | None = None
    idle_s: float | None = None
    new_from_segment: int | None = None
    answer_rewrite: AnswerRewrite | None = None
    answer_as_returned: bool = False
    parent_replica: str | None = None
    parent_computed_tokens: int | None = None

    def record_fields(self) -> dict[str, Any]:
        """The `RequestRecord` conversation fields."""
        rewrite = self.answer_rewrite
        return {
            "conversation_id": self.conversation_id,
            "conversation_source": self.source,
            "turn_index": self.turn_index,
            "parent_request_id": self.parent_request_id,
            "idle_s": None if self.idle_s is None else round(self.idle_s, 3),
            "answer_rewrite": None if rewrite is None else rewrite.kind,
            "answer_rewrite_segment": None if rewrite is None else rewrite.segment,
            "answer_rewrite_char_offset": None if rewrite is None else rewrite.char_offset,
        }
