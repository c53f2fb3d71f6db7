"""Engine results to OpenAI response bodies and server-sent-event chunks."""

from __future__ import annotations

import json
import time
import uuid

from collections.abc import Callable

from local_engine.hash_chain import page_hash_chain
from local_engine.api.choices import ChoiceResult
from local_engine.engine.types import Finished, PromptLogprobs, TokenDelta, TokenLogprob
from local_engine.api.logprobs_format import TokenStrings, chat_logprobs, completion_logprobs, merge_completion_logprobs
from local_engine.api.match_details import MatchDetails
from local_engine.api.protocol import CHAT, ParsedRequest
from local_engine.prompt.tool_calls import ToolCall, ToolCallStream, format_for


def tool_call_stream(parsed: ParsedRequest, tokenizer) -> ToolCallStream | None:
    """The splitter of content and tool calls for this request, or None when tool calls are not parsed
    (completions, no tools, or `tool_choice: "none"`)."""
    if parsed.endpoint != CHAT or parsed.tool_choice.mode == "none":
        return None
    return ToolCallStream(format_for(tokenizer), parsed.tool_opening, parsed.tool_choice.function)


def _finish_reason(finished: Finished, calls: list[ToolCall]) -> str:
    """`tool_calls` when the answer's calls are whole; `length` when `max_tokens` cut one short (as in OpenAI's
    API), so a client can tell that its arguments may be incomplete."""
    if not calls or finished.finish_reason not in ("stop", "length"):
        return finished.finish_reason
    return "tool_calls" if finished.finish_reason == "stop" or all(call.complete for call in calls) else "length"


def new_response_id(endpoint: str) -> str:
    return ("chatcmpl-" if endpoint == CHAT else "cmpl-") + uuid.uuid4().hex


def match_headers(report: MatchDetails) -> dict[str, str]:
    """Sent on every response, streamed or not: the match is known before the first token."""
    return report.headers()


def prefix_cache_object(parsed: ParsedRequest, report: MatchDetails, finished: Finished | None = None) -> dict:
    """The match report with the engine's time to first token, plus the prompt's block hash chain when asked."""
    body = report.as_dict(None if finished is None else finished.timings.ttft_ms)
    if parsed.hash_chain_block_size:
        body["hash_chain"] = hash_chain_object(parsed.namespace, parsed.prompt_token_ids, parsed.hash_chain_block_size)
    return body


def hash_chain_object(namespace: str, token_ids, block_size: int) -> dict:
    return {
        "block_size": block_size,
        "input_length": len(token_ids),
        "hash_ids": page_hash_chain(namespace, token_ids, block_size),
    }


def usage(finished: Finished | list[Finished]) -> dict:
    """The prompt counts once however many sequences (`n`, `best_of`) were generated from it; completion tokens
    are those of every sequence generated."""
    ends = finished if isinstance(finished, list) else [finished]
    prompt_tokens = ends[0].prompt_tokens
    completion_tokens = sum(end.completion_tokens for end in ends)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        # Always present: 0 means "nothing matched", never "unknown".
        "prompt_tokens_details": {"cached_tokens": ends[0].cached_tokens},
    }


def _chat_choice(choice: ChoiceResult, tools: ToolCallStream | None, strings: TokenStrings | None) -> dict:
    text = choice.text
    message: dict = {"role": "assistant", "content": text}
    calls: list[ToolCall] = []
    if tools is not None:
        content, calls = tools.feed(text)
        rest, more = tools.finish()
        calls += more
        content += rest
        message["content"] = content if content or not calls else None
        if calls:
            message["tool_calls"] = [call.as_openai() for call in calls]
    return {
        "index": choice.index,
        "message": message,
        "logprobs": chat_logprobs(choice.logprobs, strings) if strings is not None else None,
        "finish_reason": _finish_reason(choice.finished, calls),
    }


def _completion_choice(parsed: ParsedRequest, choice: ChoiceResult, prompt: PromptLogprobs | None,
                       strings: TokenStrings | None) -> dict:
    echo = parsed.echo_text if parsed.echo else ""
    logprobs = None
    if strings is not None:
        logprobs = completion_logprobs(choice.logprobs, strings, text_offset=len(echo))
        if prompt is not None:
            echoed = completion_logprobs(list(prompt.entries), strings, first_prompt_token=prompt.token_ids[0])
            logprobs = merge_completion_logprobs(echoed, logprobs)
    return {"index": choice.index, "text": echo + choice.text, "logprobs": logprobs,
            "finish_reason": choice.finished.finish_reason}


def completion_body(
    parsed: ParsedRequest,
    response_id: str,
    choices: list[ChoiceResult],
    report: MatchDetails,
    tools: Callable[[], ToolCallStream | None] = lambda: None,
    strings: TokenStrings | None = None,
    prompt: PromptLogprobs | None = None,
    ends: list[Finished] | None = None,
) -> dict:
    """`choices`: the returned sequences (already the best `n` of `best_of`); `tools` makes one tool-call splitter
    per choice; `strings` is given when the request asked for logprobs; `prompt`, its prompt's log-probabilities;
    `ends`: every sequence generated, for usage (the choices' own by default)."""
    bodies = []
    for choice in choices:
        if parsed.endpoint == CHAT:
            body = _chat_choice(choice, tools(), strings)
        else:
            body = _completion_choice(parsed, choice, prompt, strings)
        if choice.finished.matched_stop is not None:
            body["stop_reason"] = choice.finished.matched_stop  # which stop string matched, named as vLLM does
        bodies.append(body)
    return {
        "id": response_id,
        "object": "chat.completion" if parsed.endpoint == CHAT else "text_completion",
        "created": int(time.time()),
        "model": parsed.model,
        "choices": bodies,
        "usage": usage(ends or [choice.finished for choice in choices]),
        "prefix_cache": prefix_cache_object(parsed, report, choices[0].finished),
        "system_fingerprint": None,
    }


class ChunkWriter:
    """Builds the SSE byte strings of one streamed response, shaped as OpenAI sends them: one choice per chunk,
    numbered by `index` when the request asked for `n` of them. Log-probabilities ride with the chunk that carries
    their tokens' text (or the choice's last chunk, for text held back)."""

    def __init__(self, parsed: ParsedRequest, response_id: str,
                 tools: Callable[[], ToolCallStream | None] = lambda: None, strings: TokenStrings | None = None) -> None:
        self.parsed = parsed
        num = parsed.sampling.n
        self.tools = [tools() for _ in range(num)]
        self.strings = strings
        self._pending: list[list[TokenLogprob]] = [[] for _ in range(num)]
        self._text_offset = [len(parsed.echo_text) if parsed.echo else 0] * num
        self.response_id = response_id
        self.created = int(time.time())
        self.is_chat = parsed.endpoint == CHAT

    def _chunk(self, choices: list, **extra) -> bytes:
        body = {
            "id": self.response_id,
            "object": "chat.completion.chunk" if self.is_chat else "text_completion",
            "created": self.created,
            "model": self.parsed.model,
            "choices": choices,
            "system_fingerprint": None,
        }
        if self.parsed.include_usage:
            body["usage"] = None
        body.update(extra)
        return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"

    def _logprobs(self, index: int) -> dict | None:
        if self.strings is None:
            return None
        entries, self._pending[index] = self._pending[index], []
        if self.is_chat:
            return chat_logprobs(entries, self.strings)
        body = completion_logprobs(entries, self.strings, text_offset=self._text_offset[index])
        self._text_offset[index] += sum(len(token) for token in body["tokens"])
        return body

    def _choice(self, index: int, text: str | None, finish_reason: str | None, role: bool = False) -> dict:
        logprobs = None if role else self._logprobs(index)
        if self.is_chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}

    def first(self) -> bytes | None:
        """Chat streams open with the assistant role, as OpenAI's do; an echoed completions prompt comes first
        (with its log-probabilities, `prompt`, when they were asked for)."""
        if self.is_chat:
            return b"".join(self._chunk([self._choice(i, None, None, role=True)]) for i in range(len(self.tools)))
        if self.parsed.echo and self.strings is None:
            return b"".join(self._chunk([self._choice(i, self.parsed.echo_text, None)]) for i in range(len(self.tools)))
        return None

    def prompt(self, event: PromptLogprobs) -> bytes:
        """The echoed prompt with its log-probabilities (completions `echo` + `logprobs`)."""
        echoed = completion_logprobs(list(event.entries), self.strings, first_prompt_token=event.token_ids[0])
        out = b""
        for index in range(len(self.tools)):
            choice = {"index": index, "text": self.parsed.echo_text, "logprobs": echoed, "finish_reason": None}
            out += self._chunk([choice])
        return out

    def text(self, delta: TokenDelta) -> bytes:
        """The chunk(s) for newly generated text; empty while text that may open a tool call is held back."""
        self._pending[delta.index].extend(delta.logprobs)
        tools = self.tools[delta.index]
        if tools is None:
            return self._chunk([self._choice(delta.index, delta.text, None)]) if delta.text else b""
        return self._content_and_calls(delta.index, *tools.feed(delta.text))

    def _content_and_calls(self, index: int, content: str, calls: list[ToolCall]) -> bytes:
        out = self._chunk([self._choice(index, content, None)]) if content else b""
        first_index = len(self.tools[index].calls) - len(calls)  # calls are numbered across the whole answer
        for offset, call in enumerate(calls):
            delta = {"tool_calls": [call.as_openai(first_index + offset)]}
            out += self._chunk([{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}])
        return out

    def final(self, finished: Finished) -> bytes:
        reason = finished.finish_reason
        out = b""
        tools = self.tools[finished.index]
        if tools is not None:
            out = self._content_and_calls(finished.index, *tools.finish())
            reason = _finish_reason(finished, tools.calls)
        choice = self._choice(finished.index, None if self.is_chat else "", reason)
        if finished.matched_stop is not None:
            choice["stop_reason"] = finished.matched_stop
        return out + self._chunk([choice])

    def usage(self, ends: list[Finished], report: MatchDetails) -> bytes:
        """The closing usage chunk also carries the `prefix_cache` object a non-streamed body would have."""
        return self._chunk([], usage=usage(ends), prefix_cache=prefix_cache_object(self.parsed, report, ends[0]))

    def error(self, body: dict) -> bytes:
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"
