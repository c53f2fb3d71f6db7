"""Encoding a rendered chat prompt so that only the template's own text can become special tokens.

Tokenizers turn any occurrence of a special token's text (`<|im_end|>`) into that token. Message content is
client data, so where it spells a special token the prompt is encoded piece by piece: the text between the
template's special tokens is encoded with `split_special_tokens=True` (as text), the template's special tokens as
themselves. Tokenizers already cut the text at special tokens before anything else, so a prompt whose content holds
no special-token text keeps exactly the ids a plain `encode` gives; that common case takes the plain path. A caller
may name further places no token may span (`cut_after`: where the engine's own output started, so that its answer,
re-sent, encodes to the tokens it generated).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from local_engine.errors import InvalidRequest

_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"  # private-use code points framing content placeholders


def special_texts(tokenizer) -> list[str]:
    """The text of every added (control) token, longest first."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts = {token.content for token in decoder.values() if getattr(token, "content", "")}
    return sorted(texts, key=len, reverse=True)


@dataclass(frozen=True)
class EncodedPrompt:
    """A rendered chat prompt's token ids; `offsets` are each token's `(start, end)` characters in `rendered +
    opening` (None when the tokenizer is not a fast one and gives no offsets); `rendered` is the template's text."""

    token_ids: list[int]
    offsets: tuple[tuple[int, int], ...] | None
    rendered: str


def encode_rendered(
    tokenizer, plain: list[dict], render: Callable[[list[dict]], str], opening: str = "",
    cut_after: re.Pattern[str] | None = None,
) -> EncodedPrompt:
    """`render(plain) + opening` encoded with message content never read as control tokens. Where `cut_after`
    matches the rendered text, it is encoded in two pieces at the match's end (no token spans it); the opening is
    never cut."""
    specials = special_texts(tokenizer)
    rendered = render(plain)
    text = rendered + opening
    if not any(special in message["content"] for message in plain for special in specials):
        cuts: list[tuple[int, int, bool]] = [(0, len(text), False)]
    else:
        cuts = _protected_pieces(text, _content_spans(plain, render, text, opening), specials)
    if cut_after is not None:
        cuts = _split_pieces(cuts, [match.end() for match in cut_after.finditer(rendered)])
    token_ids, offsets = _encode_pieces(tokenizer, text, cuts)
    return EncodedPrompt(token_ids, offsets, rendered)


def _split_pieces(pieces: list[tuple[int, int, bool]], points: list[int]) -> list[tuple[int, int, bool]]:
    """`pieces` cut again at each of `points` that falls inside one (each part keeps its piece's `as_text`)."""
    if not points:
        return pieces
    out: list[tuple[int, int, bool]] = []
    for start, end, as_text in pieces:
        for point in points:
            if start < point < end:
                out.append((start, point, as_text))
                start = point
        out.append((start, end, as_text))
    return out


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


def _protected_pieces(
    text: str, spans: list[tuple[int, int]], specials: list[str]
) -> list[tuple[int, int, bool]]:
    """`text` cut into `(start, end, as_text)` pieces: special-token text outside `spans` is a piece of its own
    (encoded as the control token); everything else is encoded with special-token text read as plain text."""
    pattern = re.compile("|".join(re.escape(s) for s in specials))
    pieces: list[tuple[int, int, bool]] = []
    position = 0
    for match in pattern.finditer(text):
        if any(start < match.end() and match.start() < end for start, end in spans):
            continue
        if match.start() > position:
            pieces.append((position, match.start(), True))
        pieces.append((match.start(), match.end(), False))
        position = match.end()
    if position < len(text):
        pieces.append((position, len(text), True))
    return pieces


def _encode_pieces(
    tokenizer, text: str, pieces: list[tuple[int, int, bool]]
) -> tuple[list[int], tuple[tuple[int, int], ...] | None]:
    """Ids of the pieces in order, and each token's character offsets in `text` when the tokenizer is fast."""
    fast = getattr(tokenizer, "is_fast", False)
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    for start, end, as_text in pieces:
        options = {"split_special_tokens": True} if as_text else {}
        if fast:
            encoding = tokenizer(text[start:end], add_special_tokens=False, return_offsets_mapping=True, **options)
            ids += encoding["input_ids"]
            offsets += [(start + int(a), start + int(b)) for a, b in encoding["offset_mapping"]]
        else:
            ids += tokenizer.encode(text[start:end], add_special_tokens=False, **options)
    return ids, (tuple(offsets) if fast else None)


def encode_protected(tokenizer, text: str, spans: list[tuple[int, int]], specials: list[str]) -> list[int]:
    """Ids of `text` where special-token text counts only outside `spans`."""
    return _encode_pieces(tokenizer, text, _protected_pieces(text, spans, specials))[0]
