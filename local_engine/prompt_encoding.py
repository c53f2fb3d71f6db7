"""Encoding a rendered chat prompt so that only the template's own text can become special tokens.

Tokenizers turn any occurrence of a special token's text (`<|im_end|>`) into that token. Message content is
client data, so where it spells a special token the prompt is encoded piece by piece: the text between the
template's special tokens is encoded with `split_special_tokens=True` (as text), the template's special tokens as
themselves. Tokenizers already cut the text at special tokens before anything else, so a prompt whose content holds
no special-token text keeps exactly the ids a plain `encode` gives; that common case takes the plain path.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from local_engine.errors import InvalidRequest

_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"  # private-use code points framing content placeholders


def special_texts(tokenizer) -> list[str]:
    """The text of every added (control) token, longest first."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts = {token.content for token in decoder.values() if getattr(token, "content", "")}
    return sorted(texts, key=len, reverse=True)


def encode_rendered(tokenizer, plain: list[dict], render: Callable[[list[dict]], str], opening: str = "") -> list[int]:
    """Ids of `render(plain) + opening`, with message content never read as control tokens."""
    specials = special_texts(tokenizer)
    text = render(plain) + opening
    if not any(special in message["content"] for message in plain for special in specials):
        return tokenizer.encode(text, add_special_tokens=False)
    spans = _content_spans(plain, render, text, opening)
    return encode_protected(tokenizer, text, spans, specials)


def _content_spans(plain: list[dict], render, text: str, opening: str) -> list[tuple[int, int]]:
    """[start, end) of each message's content inside `text`, found by rendering placeholders instead."""
    marked = [{**m, "content": f"{_MARK_OPEN}{i}{_MARK_CLOSE}"} for i, m in enumerate(plain)]
    skeleton = render(marked) + opening
    pieces = re.split(f"{_MARK_OPEN}(\\d+){_MARK_CLOSE}", skeleton)
    spans, position, rebuilt = [], 0, []
    for index, piece in enumerate(pieces):
        if index % 2 == 0:
            rebuilt.append(piece)
            position += len(piece)
        else:
            content = plain[int(piece)]["content"]
            spans.append((position, position + len(content)))
            rebuilt.append(content)
            position += len(content)
    if "".join(rebuilt) != text:
        raise InvalidRequest(
            "a message spells a control token, and this model's chat template does not keep content verbatim, so "
            "it cannot be encoded as text",
            param="messages",
        )
    return spans


def encode_protected(tokenizer, text: str, spans: list[tuple[int, int]], specials: list[str]) -> list[int]:
    """Ids of `text` where special-token text counts only outside `spans`."""
    pattern = re.compile("|".join(re.escape(s) for s in specials))
    cuts: list[tuple[int, int]] = []
    for match in pattern.finditer(text):
        if not any(start < match.end() and match.start() < end for start, end in spans):
            cuts.append((match.start(), match.end()))
    ids: list[int] = []
    position = 0
    for start, end in cuts:
        if start > position:
            ids += tokenizer.encode(text[position:start], add_special_tokens=False, split_special_tokens=True)
        ids += tokenizer.encode(text[start:end], add_special_tokens=False)
        position = end
    if position < len(text):
        ids += tokenizer.encode(text[position:], add_special_tokens=False, split_special_tokens=True)
    return ids
