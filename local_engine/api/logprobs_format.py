"""Log-probabilities in OpenAI's two shapes.

Chat (`choices[].logprobs`): `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}]}], "refusal": null}`. Completions (`choices[].logprobs`): `{"tokens": [...], "token_logprobs": [...],
"top_logprobs": [{token: logprob}] , "text_offset": [...]}`, where an echoed prompt's first token has null entries.

A token's text is `tokenizer.decode([id])` (a token holding part of a UTF-8 character reads as U+FFFD, as in vLLM);
`bytes` are that text's UTF-8 bytes.
"""

from __future__ import annotations

from functools import lru_cache

from local_engine.engine.types import TokenLogprob


class TokenStrings:
    """Token id -> its text, cached (one per tokenizer)."""

    def __init__(self, tokenizer) -> None:
        self._text = lru_cache(maxsize=65536)(lambda token_id: tokenizer.decode([token_id]))

    def __call__(self, token_id: int) -> str:
        return self._text(token_id)


def _chat_item(strings: TokenStrings, token_id: int, logprob: float) -> dict:
    text = strings(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: list[TokenLogprob], strings: TokenStrings) -> dict:
    content = []
    for entry in entries:
        item = _chat_item(strings, entry.token_id, entry.logprob)
        item["top_logprobs"] = [_chat_item(strings, t, lp) for t, lp in entry.top]
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], strings: TokenStrings, text_offset: int = 0,
                        first_prompt_token: int | None = None) -> dict:
    """`first_prompt_token`: an echoed prompt's first token, which has no log-probability (listed first, with
    nulls). `text_offset`: where the first listed token's text starts in the choice's text."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = text_offset

    def add(token_id: int, logprob: float | None, top: dict | None) -> None:
        nonlocal offset
        text = strings(token_id)
        out["tokens"].append(text)
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(text)

    if first_prompt_token is not None:
        add(first_prompt_token, None, None)
    for entry in entries:
        add(entry.token_id, entry.logprob, {strings(t): lp for t, lp in entry.top})
    return out


def merge_completion_logprobs(first: dict, second: dict) -> dict:
    return {key: first[key] + second[key] for key in first}
