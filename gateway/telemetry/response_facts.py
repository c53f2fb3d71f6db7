"""What an upstream's response says that the request's record does not keep, for the request's span: the response
id, the model that answered and each choice's finish reason (`gen_ai.response.*`)."""

from __future__ import annotations

import re
from typing import Any

import msgspec

# A `finish_reason` member with a string value in a chunk's JSON (quotes inside JSON strings are escaped, so this
# matches only an object member).
FINISH_REASON = re.compile(rb'"finish_reason"\s*:\s*"([^"\\]*)"')


class _Choice(msgspec.Struct):
    finish_reason: Any = None


_CHOICES = msgspec.json.Decoder(list[_Choice])


class ResponseFacts:
    """What the upstream's response said that the record does not keep: its id, model and finish reasons."""

    __slots__ = ("response_id", "response_model", "finish_reasons")

    def __init__(self) -> None:
        self.response_id: str | None = None
        self.response_model: str | None = None
        self.finish_reasons: list[str] = []

    def read_body(self, response_id: Any, model: Any, choices: Any) -> None:
        """From a response body or a stream chunk: `id`, `model` and each choice's `finish_reason` (`choices` as a
        decoded list or as raw JSON)."""
        if isinstance(response_id, str) and self.response_id is None:
            self.response_id = response_id
        if isinstance(model, str) and self.response_model is None:
            self.response_model = model
        if isinstance(choices, msgspec.Raw):
            try:
                choices = [{"finish_reason": c.finish_reason} for c in _CHOICES.decode(choices)]
            except (msgspec.DecodeError, msgspec.ValidationError):
                return
        if isinstance(choices, list):
            for choice in choices:
                reason = choice.get("finish_reason") if isinstance(choice, dict) else None
                if isinstance(reason, str):
                    self.finish_reasons.append(reason)

    def add_finish_reason(self, reason: str) -> None:
        self.finish_reasons.append(reason)

    def read_message(self, message_id: Any, model: Any, stop_reason: Any) -> None:
        """From an Anthropic Messages API message (or its stream's `message_start` / `message_delta`): `id`, `model`
        and `stop_reason`, which the GenAI conventions record as the finish reason."""
        self.read_body(message_id, model, None)
        if isinstance(stop_reason, str):
            self.finish_reasons.append(stop_reason)

    def copy_to(self, other: ResponseFacts) -> None:
        other.response_id = self.response_id
        other.response_model = self.response_model
        other.finish_reasons = list(self.finish_reasons)

    def scan_finish_reasons(self, data: bytes) -> None:
        """Finish reasons in raw stream events the relay forwards without decoding."""
        if b'"finish_reason"' in data:
            for match in FINISH_REASON.finditer(data):
                self.finish_reasons.append(match.group(1).decode("utf-8", "replace"))
