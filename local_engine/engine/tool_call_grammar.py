"""Strict function tools (`"strict": true` in a tool's `function`): the model's tool calls, as its tool-call format
writes them (`<tool_call>{"name": ..., "arguments": ...}</tool_call>` for the Hermes format), as an llguidance Lark
grammar whose arguments follow each strict function's `parameters` JSON schema. The engine enforces it as it enforces
`response_format` (`local_engine.engine.structured_output`).

The grammar starts where the prompt's opening (`local_engine.api.protocol`) leaves the answer:

- a forced call of one function (`tool_choice` naming it, or `required` with one tool): the opening ends before the
  arguments; the grammar is the arguments and the close of the call's body;
- `required` with several tools: the opening ends where the name starts; one alternative per tool (the rest of its
  name, then its arguments);
- `auto`: free text, or text up to the format's open tag and then one or more calls (nothing after the last one).

Arguments of a strict function match its schema (compiled strictly: a keyword the grammar cannot enforce is a 400
naming `tools[i].function.parameters`); those of a non-strict function in the same request are any JSON object.
Arguments are written as `json.dumps` writes JSON (`", "` and `": "`), as the format's opening writes its keys.
"""

from __future__ import annotations

import json

import llguidance

from local_engine.engine.structured_output import compile_json_schema
from local_engine.errors import InvalidRequest
from local_engine.prompt.tool_calls import ToolCallFormat

_ARGUMENT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def strict_tool_schemas(tools: list[dict] | None) -> dict[str, dict]:
    """Function name -> `parameters` schema of each tool with `strict: true` (a strict function without parameters
    takes none). Raises InvalidRequest naming `tools[i].function.parameters` for a schema that cannot be compiled."""
    schemas = {}
    for index, tool in enumerate(tools or ()):
        function = tool["function"]
        if function.get("strict") is True:
            schema = function.get("parameters") or _NO_PARAMETERS
            compile_json_schema(schema, strict=True, param=f"tools[{index}].function.parameters")
            schemas[function["name"]] = schema
    return schemas


def tool_call_grammar(fmt: ToolCallFormat, names: tuple[str, ...], strict: dict[str, dict], opening: str) -> str:
    """The grammar of what follows `opening` (empty for `auto`: text or calls) when the answer calls one of `names`.

    `strict`: the strict functions' schemas (`strict_tool_schemas`). Raises InvalidRequest naming `tools` when the
    combined grammar is refused (each schema compiled on its own already)."""
    rules = []
    for number, name in enumerate(names):
        schema = strict.get(name, {"type": "object"})
        options = {**_ARGUMENT_JSON, "lenient": name not in strict}
        rules.append(f"args_{number}: %json {json.dumps({**schema, 'x-guidance': options})}")
    if opening:
        alternatives = [_call_body(fmt, name, number, opening) for number, name in enumerate(names)]
        rules.insert(0, "start: " + " | ".join(alternatives))
    else:
        bodies = " | ".join(_call_body(fmt, name, number, fmt.open_tag) for number, name in enumerate(names))
        rules[:0] = [
            "start: TEXT | text_until_call call more_calls*",
            f"text_until_call[lazy]: TEXT {_literal(fmt.open_tag)}",
            f'more_calls: "\\n"? {_literal(fmt.open_tag)} call',
            f'call: "\\n"? ({bodies}) "\\n"? {_literal(fmt.close_tag)}',
            "TEXT: /(.|\\n)*/",
        ]
    grammar = llguidance.LLMatcher.grammar_from_lark("\n".join(rules))
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem:
        raise InvalidRequest(f"tools: the strict tools' grammar cannot be built: {problem[:500]}", param="tools")
    return grammar


def _call_body(fmt: ToolCallFormat, name: str, number: int, opening: str) -> str:
    """One call's text after `opening` (which the call's text starts with) as Lark: literal, arguments, literal."""
    head = fmt.open_tag + fmt.body_head(name)
    if not head.startswith(opening):
        raise ValueError(f"the opening {opening!r} does not start a call of {name!r}")
    parts = [_literal(head[len(opening):]), f"args_{number}", _literal(fmt.body_tail)]
    return "(" + " ".join(part for part in parts if part) + ")"


def _literal(text: str) -> str:
    """A Lark string literal (JSON's escapes are Lark's), or nothing for empty text."""
    return json.dumps(text) if text else ""
