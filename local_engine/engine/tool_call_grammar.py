"""Tool calls under a grammar: the model's tool calls, as its tool-call format writes them (`<tool_call>{"name": ...,
"arguments": ...}</tool_call>` for the Hermes format), as an llguidance Lark grammar whose arguments follow their
function's `parameters` JSON schema. The engine enforces it as it enforces `response_format`
(`local_engine.engine.structured_output`).

Which schemas apply (`argument_schemas`), as vLLM constrains tool calls:

- a forced call (`tool_choice` naming a function, or `required`): the schema of every function it may call, strict
  or not;
- `auto`: the schemas of the tools with `"strict": true` (with none, `auto` is not constrained at all).

A strict schema is compiled as it is, strictly (a keyword the grammar cannot enforce is a 400). A non-strict one is
compiled leniently (such keywords are ignored), and an object in it that lists its `properties` and says nothing of
others (no `additionalProperties`, `patternProperties` or `unevaluatedProperties`) takes no others, as xgrammar,
vLLM's default grammar backend, compiles schemas: a small model otherwise goes on writing keys of its own and runs
into `max_tokens`. A schema that cannot be compiled at all is a 400 naming `tools[i].function.parameters`.

The grammar starts where the prompt's opening (`local_engine.api.protocol`) leaves the answer:

- a forced call of one function (`tool_choice` naming it, or `required` with one tool): the opening ends before the
  arguments; the grammar is the arguments and the close of the call's body;
- `required` with several tools: the opening ends where the name starts; one alternative per tool (the rest of its
  name, then its arguments);
- `auto`: free text, or text up to the format's open tag and then one or more calls (nothing after the last one).

Arguments of a function without a schema that applies are any JSON object. Arguments are written as `json.dumps`
writes JSON (`", "` and `": "`), as the format's opening writes its keys; their keys come in the schema's order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import llguidance

from local_engine.engine.structured_output import compile_json_schema
from local_engine.errors import InvalidRequest
from local_engine.prompt.tool_calls import ToolCallFormat

_ARGUMENT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# OpenAI: a function without `parameters` takes none. Strict, that is exactly `{}`; otherwise any object, as vLLM
# leaves a non-strict function's arguments open when it declares nothing.
_NO_PARAMETERS_STRICT = {"type": "object", "properties": {}, "additionalProperties": False}
_ANY_OBJECT = {"type": "object"}
# Where a schema holds other schemas (JSON Schema 2020-12 and draft 7): keyword -> name -> schema, keyword -> list of
# schemas, keyword -> schema.
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"})
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "prefixItems", "items"})
_SCHEMAS = frozenset({"items", "additionalProperties", "unevaluatedProperties", "additionalItems",
                      "unevaluatedItems", "contains", "propertyNames", "not", "if", "then", "else"})
_OTHER_PROPERTIES = frozenset({"additionalProperties", "patternProperties", "unevaluatedProperties"})


@dataclass(frozen=True)
class ArgumentSchema:
    """The JSON schema a function's call arguments follow; `strict`: compiled strictly (see the module)."""

    schema: dict
    strict: bool


def argument_schemas(tools: list[dict] | None, forced: tuple[str, ...] = ()) -> dict[str, ArgumentSchema]:
    """Function name -> the schema its arguments follow: every strict tool's (whatever `tool_choice` says, so a
    strict schema is always checked) and every tool's whose name is in `forced` (the functions a forced call may
    take). Raises InvalidRequest naming `tools[i].function.parameters` for a schema that cannot be compiled."""
    schemas = {}
    for index, tool in enumerate(tools or ()):
        function = tool["function"]
        strict = function.get("strict") is True
        if not strict and function["name"] not in forced:
            continue
        schema = function.get("parameters") or (_NO_PARAMETERS_STRICT if strict else _ANY_OBJECT)
        schema = schema if strict else closed_objects(schema)
        compile_json_schema(schema, strict=strict, param=f"tools[{index}].function.parameters")
        schemas[function["name"]] = ArgumentSchema(schema, strict)
    return schemas


def closed_objects(schema: dict) -> dict:
    """A copy of `schema` in which every object that lists `properties` and says nothing of other properties takes
    no others (`"additionalProperties": false`). Members of `allOf` are left open: closing each would refuse the
    properties the others add."""
    closed = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            closed[key] = {name: _closed(member) for name, member in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            closed[key] = [_closed(member) for member in value]
        elif key in _SCHEMAS:
            closed[key] = _closed(value)
        else:  # values (`enum`, `const`, `default`...), `allOf`, annotations: as they are
            closed[key] = value
    if "properties" in schema and not schema.keys() & _OTHER_PROPERTIES:
        closed["additionalProperties"] = False
    return closed


def _closed(schema: object) -> object:
    return closed_objects(schema) if isinstance(schema, dict) else schema  # `true`/`false` schemas stay


def tool_call_grammar(fmt: ToolCallFormat, names: tuple[str, ...], schemas: dict[str, ArgumentSchema],
                      opening: str) -> str:
    """The grammar of what follows `opening` (empty for `auto`: text or calls) when the answer calls one of `names`.

    `schemas`: from `argument_schemas`; a name without one takes any JSON object. Raises InvalidRequest naming
    `tools` when the combined grammar is refused (each schema compiled on its own already)."""
    rules = []
    for number, name in enumerate(names):
        argument = schemas.get(name, ArgumentSchema(_ANY_OBJECT, strict=False))
        options = {**_ARGUMENT_JSON, "lenient": not argument.strict}
        rules.append(f"args_{number}: %json {json.dumps({**argument.schema, 'x-guidance': options})}")
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
        raise InvalidRequest(f"tools: the tool calls' grammar cannot be built: {problem[:500]}", param="tools")
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
