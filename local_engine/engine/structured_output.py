"""Structured outputs: `response_format` (`json_object`, `json_schema`) and strict function tools
(`local_engine.engine.tool_call_grammar`), enforced by constrained decoding with llguidance (the grammar engine vLLM
and SGLang use; https://github.com/guidance-ai/llguidance).

A request's format becomes an llguidance grammar when it is parsed (a schema it cannot compile is a 400 naming
`response_format`). The engine builds one `LLMatcher` per request from the shared `LLTokenizer`; in each step the
matchers of the batch's constrained rows fill one token bitmask (`[rows, ceil(vocab / 32)]` int32, one bit per token;
in parallel by llguidance's executor from 4 rows where the model runs on another device), which sets every token the
grammar does not allow to -inf in those rows only. Unconstrained rows in the same batch are untouched.
"""

from __future__ import annotations

import threading

import llguidance
import llguidance.hf
import llguidance.torch
import numpy
import torch

from local_engine.errors import InvalidRequest

# Compact JSON (no optional whitespace): what a schema allows, in the fewest tokens. Non-strict schemas are compiled
# leniently (keywords llguidance cannot enforce are ignored); with `strict: true` such a keyword is a 400.
_JSON_OPTIONS = {"whitespace_flexible": False}
# The executor's threads fill masks in parallel from this many rows, when the step ran on another device. Where the
# model runs on the CPU, torch's OpenMP threads keep spinning on every core between a step's parallel regions and the
# executor's threads wait for them: on a 2-core Xeon, 8 constrained rows decoded 0.11-0.20 slower than unconstrained
# with the executor and 0.03-0.07 with the masks filled one after another (about 2 us a row).
_PARALLEL_FROM_ROWS = 4


def compile_json_schema(schema: dict, strict: bool, param: str) -> str:
    """The llguidance grammar of a JSON schema. Raises InvalidRequest naming `param` when it cannot be compiled."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={**_JSON_OPTIONS, "lenient": not strict}
        )
    except ValueError as exc:
        raise InvalidRequest(f"{param}: the schema cannot be compiled: {exc}", param=param) from None
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem:
        raise InvalidRequest(f"{param}: the schema cannot be compiled: {problem[:500]}", param=param)
    return grammar


def response_format_grammar(value: object) -> str | None:
    """The grammar for an OpenAI `response_format` (None for absent or `{"type": "text"}`).

    Raises InvalidRequest naming `response_format` for an unknown type, a missing schema or one that cannot be
    compiled."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest("response_format must be an object", param="response_format")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return compile_json_schema({"type": "object"}, strict=False, param="response_format")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise InvalidRequest("response_format.json_schema must be an object with a `schema` object",
                                 param="response_format")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidRequest("response_format.json_schema.strict must be a boolean", param="response_format")
        # OpenAI allows the schema to be left out (any JSON); an empty schema compiles to any JSON value.
        return compile_json_schema(spec.get("schema") or {}, strict=bool(strict), param="response_format")
    raise InvalidRequest(
        f"response_format.type must be one of text, json_object, json_schema; got {str(kind)[:100]!r}",
        param="response_format",
    )


class GrammarMasks:
    """Per engine: the llguidance tokenizer (built once, about a second for a 49k vocabulary), matchers per request
    and the batched bitmask for one step."""

    def __init__(self, tokenizer, eos_token_ids: frozenset[int]) -> None:
        self._hf_tokenizer = tokenizer
        self._eos = sorted(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._executor: llguidance.LLExecutor | None = None
        self._lock = threading.Lock()

    def _ll_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer)
                self._executor = llguidance.LLExecutor()
            return self._tokenizer

    def matcher(self, grammar: str, param: str = "response_format") -> llguidance.LLMatcher:
        """A fresh matcher at the grammar's start. Raises InvalidRequest naming `param` when the grammar does not
        build against this tokenizer. Blocking (up to about a second the first time): call it off the event loop."""
        matcher = llguidance.LLMatcher(self._ll_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequest(f"{param}: the grammar cannot be used: {matcher.get_error()[:500]}", param=param)
        return matcher

    def apply(self, logits: torch.Tensor, rows: list[tuple[int, llguidance.LLMatcher]]) -> None:
        """Set every token a row's matcher does not allow next to -inf, in place. `logits`: float32
        `[num_rows, vocab]`; `rows`: (row index, matcher) of the constrained rows. The engine's EOS ids count as
        one: any of them may end an output the grammar accepts."""
        if not rows:
            return
        vocab = logits.shape[1]
        num_words = (max(vocab, self._ll_tokenizer().vocab_size) + 31) // 32
        bitmask = torch.zeros((len(rows), num_words), dtype=torch.int32)
        if len(rows) >= _PARALLEL_FROM_ROWS and logits.device.type != "cpu":
            llguidance.torch.fill_next_token_bitmask_par(
                self._executor, [(matcher, i) for i, (_, matcher) in enumerate(rows)], bitmask
            )
        else:  # a few rows, or on the CPU: the executor's hand-off costs more than it saves
            for i, (_, matcher) in enumerate(rows):
                llguidance.torch.fill_next_token_bitmask(matcher, bitmask, i)
        # Bit j of word w is token 32 * w + j (little-endian), as llguidance lays the mask out.
        bits = numpy.unpackbits(bitmask.numpy().view(numpy.uint8), axis=1, bitorder="little")[:, :vocab]
        allowed = torch.from_numpy(bits.astype(bool))
        for i, (_, matcher) in enumerate(rows):
            if matcher.is_accepting():
                allowed[i, [t for t in self._eos if t < vocab]] = True
        refused = ~allowed.to(logits.device)
        indices = [row for row, _ in rows]
        if indices == list(range(logits.shape[0])):  # every row constrained: mask in place
            logits.masked_fill_(refused, float("-inf"))
            return
        index = torch.tensor(indices, dtype=torch.int64, device=logits.device)
        constrained = logits.index_select(0, index)
        constrained.masked_fill_(refused, float("-inf"))
        logits.index_copy_(0, index, constrained)
