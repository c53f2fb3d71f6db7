"""Where each token of a rendered prompt came from, in the request's own terms.

A chat prompt is the chat template's text around the request's parts: `tools` (rendered one JSON object per line, as
`local_engine.prompt.chat_prompt` does), `system` (a leading system or developer message), `messages[i]`; a completions
prompt is its `prompt`. `PromptLayout` keeps, for one tokenized prompt, the character span of each part in the
rendered text and each token's character span (the tokenizer's offsets), so that:

- `locate(token_index)` says which part a token starts in and at which character inside it: with the number of
  matched tokens, that is where the first uncached token lies;
- `template_tokens` counts the leading tokens made of template text alone (`<|im_start|>system\n`, or a default
  system prompt the template inserts): every prompt of this shape starts with them, so a match that ends within
  them reused nothing of the request.

Offsets inside `tools` refer to the tools as the engine renders them: `json.dumps(tool, ensure_ascii=False)` per
tool, joined by newlines. Offsets inside a message refer to its text content (text parts joined); an assistant
message's tool calls follow its text (after a newline, unless the text is empty or ends in whitespace).
"""

from __future__ import annotations

from dataclasses import dataclass

TOOLS = "tools"
SYSTEM = "system"
PROMPT = "prompt"


def message_segment(index: int, role: str) -> str:
    """The name of `messages[index]` as a segment: `system` for a leading system or developer message."""
    return SYSTEM if index == 0 and role in ("system", "developer") else f"messages[{index}]"


@dataclass(frozen=True, slots=True)
class Span:
    """One part of the request inside the rendered text: characters `[start, end)` hold the part's characters
    `[base, base + end - start)`."""

    segment: str
    start: int
    end: int
    base: int = 0


@dataclass(frozen=True, slots=True)
class Location:
    """A position in the request's own terms: the part (`tools`, `system`, `messages[3]`, `prompt`) and the character
    offset inside it."""

    segment: str
    char_offset: int


@dataclass(frozen=True, slots=True)
class PromptLayout:
    """The spans of the request's parts in the rendered text (in order) and each token's `(start, end)` characters."""

    spans: tuple[Span, ...]
    token_offsets: tuple[tuple[int, int], ...]

    @property
    def template_tokens(self) -> int:
        """Leading tokens that end before the first character of the request's own content."""
        if not self.spans:
            return 0
        first = self.spans[0].start
        count = 0
        for start, end in self.token_offsets:
            if end > first or (end == start and start >= first):
                break
            count += 1
        return count

    def segment_starts(self) -> tuple[tuple[str, int], ...]:
        """Each part's first token, in prompt order: `(segment, token index)` of the first token that ends after the
        part's first character (a token shared with the text before it counts as the part's)."""
        starts: list[tuple[str, int]] = []
        token = 0
        for span in self.spans:
            if starts and starts[-1][0] == span.segment:
                continue  # a part in several spans (a message's text, then its tool calls)
            while token < len(self.token_offsets) and self.token_offsets[token][1] <= span.start:
                token += 1
            starts.append((span.segment, token))
        return tuple(starts)

    def locate(self, token_index: int) -> Location | None:
        """Where token `token_index` starts: inside a part, or (for template text between parts) at the end of the
        part it directly follows, else at the start of the next part. None past the prompt or without spans."""
        if not self.spans or not 0 <= token_index < len(self.token_offsets):
            return None
        char = self.token_offsets[token_index][0]
        previous = None
        for span in self.spans:
            if char < span.start:
                if previous is not None and char == previous.end:
                    return Location(previous.segment, previous.base + previous.end - previous.start)
                return Location(span.segment, span.base)
            if char < span.end:
                return Location(span.segment, span.base + char - span.start)
            previous = span
        last = self.spans[-1]
        return Location(last.segment, last.base + last.end - last.start)


def find_spans(rendered: str, parts: list[tuple[str, str, int]]) -> tuple[Span, ...]:
    """Spans of `parts` (`(segment, text, base)`, in prompt order) found one after another in `rendered`; an empty
    tuple when one cannot be found (a template that rewrites content), so that nothing is located wrongly."""
    spans = []
    cursor = 0
    for segment, text, base in parts:
        if not text:
            continue
        at = rendered.find(text, cursor)
        if at < 0:
            return ()
        spans.append(Span(segment, at, at + len(text), base))
        cursor = at + len(text)
    return tuple(spans)
