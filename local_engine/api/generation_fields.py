"""The request fields that shape generation beyond temperature and top_p: `n`, `best_of`, `logprobs`,
`top_logprobs`, `echo`, the penalties, `logit_bias`, `min_tokens` and `response_format`, read into SamplingParams
fields. Each wrong value is an `InvalidRequest` naming its field.

Limits: `n` and `best_of` up to 16 sequences; up to 20 top log-probabilities (OpenAI's chat limit; its completions
allow 5); `logit_bias` up to 1024 entries of [-100, 100].
"""

from __future__ import annotations

from dataclasses import dataclass

from local_engine.errors import InvalidRequest
from local_engine.api.fields import optional_bool, optional_int, optional_number
from local_engine.engine.structured_output import response_format_grammar

MAX_SEQUENCES = 16
MAX_TOP_LOGPROBS = 20
_MAX_LOGIT_BIAS_ENTRIES = 1024


@dataclass(frozen=True)
class GenerationFields:
    """`sampling`: keyword arguments for SamplingParams; `echo`: a completions response starts with its prompt."""

    sampling: dict
    echo: bool = False


def _logprobs(body: dict, is_chat: bool) -> tuple[int | None, bool]:
    """(top alternatives per token or None when off, echo)."""
    if is_chat:
        if body.get("echo") is not None:
            raise InvalidRequest("echo is a completions field; chat completions do not take it", param="echo")
        wanted = optional_bool(body, "logprobs", False)
        top = optional_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if top is not None and not wanted:
            raise InvalidRequest("top_logprobs needs logprobs set to true", param="top_logprobs")
        return (top or 0) if wanted else None, False
    if body.get("top_logprobs") is not None:
        raise InvalidRequest("top_logprobs is a chat field; completions take logprobs as a number",
                             param="top_logprobs")
    return optional_int(body, "logprobs", 0, MAX_TOP_LOGPROBS), optional_bool(body, "echo", False)


def _logit_bias(body: dict, vocab_size: int) -> tuple[tuple[int, float], ...]:
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > _MAX_LOGIT_BIAS_ENTRIES:
        raise InvalidRequest(f"logit_bias must be an object of at most {_MAX_LOGIT_BIAS_ENTRIES} token ids",
                             param="logit_bias")
    entries = []
    for key, bias in value.items():
        if not key.isdigit() or int(key) >= vocab_size:
            raise InvalidRequest(f"logit_bias keys must be token ids in [0, {vocab_size}); got {key[:40]!r}",
                                 param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise InvalidRequest("logit_bias values must be numbers in [-100, 100]", param="logit_bias")
        entries.append((int(key), float(bias)))
    return tuple(entries)


def _sequences(body: dict, is_chat: bool, stream: bool) -> tuple[int, int]:
    n = optional_int(body, "n", 1, MAX_SEQUENCES) or 1
    best_of = optional_int(body, "best_of", 1, MAX_SEQUENCES)
    if best_of is None:
        return n, n
    if is_chat:
        raise InvalidRequest("best_of is a completions field; use n with chat completions", param="best_of")
    if best_of < n:
        raise InvalidRequest(f"best_of ({best_of}) must be at least n ({n})", param="best_of")
    if stream and best_of > n:
        raise InvalidRequest("best_of greater than n cannot be streamed: the best are known only at the end",
                             param="best_of")
    return n, best_of


def parse_generation_fields(body: dict, is_chat: bool, stream: bool, vocab_size: int) -> GenerationFields:
    """Raises InvalidRequest naming the field for every value out of its type or range."""
    logprobs, echo = _logprobs(body, is_chat)
    n, best_of = _sequences(body, is_chat, stream)
    repetition_penalty = optional_number(body, "repetition_penalty", 1.0, 0.0, 100.0)
    if repetition_penalty <= 0:
        raise InvalidRequest("repetition_penalty must be greater than 0", param="repetition_penalty")
    sampling = {
        "n": n,
        "best_of": best_of,
        "logprobs": logprobs,
        "prompt_logprobs": logprobs if echo else None,
        "presence_penalty": optional_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        "frequency_penalty": optional_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        "repetition_penalty": repetition_penalty,
        "logit_bias": _logit_bias(body, vocab_size),
        "min_tokens": optional_int(body, "min_tokens", 0, 2**31 - 1) or 0,
        "grammar": response_format_grammar(body.get("response_format")),
    }
    return GenerationFields(sampling, echo)
