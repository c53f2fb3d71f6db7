"""Where a JSON value that the prompt opened is closed by the generated text.

A forced tool call opens its JSON body in the prompt (`{"name": "f", "arguments": {"city": "`); a small model often
closes it (`Paris"}}`) and then keeps writing instead of emitting the format's close tag. The call ends where the
outermost object closes, as a stop string would end it.
"""

from __future__ import annotations


class JsonCloser:
    """Tracks the nesting of objects and arrays (outside strings, escapes included) of JSON text fed in pieces.

    Only brackets are counted, not validated: text that is no JSON still closes at its matching bracket, and the
    tool-call parser then judges what was written (RFC 8259's grammar for strings and structure).
    """

    def __init__(self, opened: str) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False
        if self.feed(opened) is not None:
            raise ValueError(f"the opened JSON text is already closed: {opened!r}")

    def feed(self, text: str) -> int | None:
        """The index in `text` just past the character that closes the outermost value, or None while open."""
        for index, char in enumerate(text):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]" and self._depth > 0:
                self._depth -= 1
                if self._depth == 0:
                    return index + 1
        return None
