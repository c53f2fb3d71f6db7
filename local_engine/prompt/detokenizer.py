"""Token ids to streamed text, with stop strings that may span tokens."""

from __future__ import annotations

from local_engine.prompt.json_closer import JsonCloser


class IncrementalDetokenizer:
    """Feeds generated token ids, returns newly printable text, and detects stop strings.

    Text that could still turn into a stop string is held back until it cannot; a stop string and everything after
    it are never emitted (as in the OpenAI API). With `closing_json` (the JSON text a forced tool call's opening put
    in the prompt), the text also ends where it closes that JSON value; `matched_stop` then stays None.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...], closing_json: str = "") -> None:
        self._tokenizer = tokenizer
        self._closer = JsonCloser(closing_json) if closing_json else None
        self._scanned = 0  # how much of the text the closer has read
        self._stop = tuple(s for s in stop if s)
        self._hold_back = max((len(s) for s in self._stop), default=1) - 1
        self._token_ids: list[int] = []
        self._text = ""
        self._emitted = 0
        self.stopped = False
        self.matched_stop: str | None = None  # the stop string that ended the text, when one did

    @property
    def text(self) -> str:
        return self._text

    def feed(self, token_id: int) -> str:
        self._token_ids.append(token_id)
        text = self._tokenizer.decode(self._token_ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""  # an incomplete multi-byte character: wait for the next token
        closed = False
        if self._closer is not None:
            closed_at = self._closer.feed(text[self._scanned:])
            if closed_at is not None:
                text, closed = text[: self._scanned + closed_at], True
            self._scanned = len(text)
        self._text = text
        for stop in self._stop:
            # Search only where a new match could start, so earlier text is not scanned again.
            found = text.find(stop, max(0, self._emitted - len(stop)))
            if found != -1:
                self._text = text[:found]
                self.stopped = True
                self.matched_stop = stop
                return self._take(len(self._text))
        if closed:
            self.stopped = True
            return self._take(len(text))
        return self._take(max(self._emitted, len(text) - self._hold_back))

    def flush(self) -> str:
        """The held-back text, once generation has ended without a stop string."""
        return self._take(len(self._text))

    def _take(self, end: int) -> str:
        if end <= self._emitted:
            return ""
        piece, self._emitted = self._text[self._emitted : end], end
        return piece
