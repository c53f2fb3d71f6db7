"""OpenAI request bodies to engine requests, with a clear 400 for everything the engine cannot honour."""

from __future__ import annotations

from dataclasses import dataclass

from local_engine.hash_chain import MAX_BLOCK_SIZE
from local_engine.cache.tiers import RETENTION_CLASSES
from local_engine.prompt.chat_messages import ToolChoice, check_tools, parse_tool_choice
from local_engine.prompt.chat_prompt import chat_prompt, text_prompt
from local_engine.errors import InvalidRequest, ModelNotFound
from local_engine.api.generation_fields import parse_generation_fields
from local_engine.model.loader import LoadedModel
from local_engine.prompt.layout import PromptLayout
from local_engine.api.fields import (
    INT64_MAX,
    INT64_MIN,
    check_ignored_fields,
    optional_bool,
    optional_choice,
    optional_int,
    optional_number,
    optional_object,
    optional_str,
    parse_json_body,
    stop_strings,
)
from local_engine.engine.sampling import SamplingParams
from local_engine.engine.tool_call_grammar import argument_schemas, tool_call_grammar
from local_engine.prompt.tool_calls import format_for

CHAT = "chat.completions"
COMPLETIONS = "completions"

# Parameters an OpenAI client may send that this engine cannot honour: refuse rather than silently ignore
# (docs/apis.md lists them).
_UNSUPPORTED_WHEN_SET = {
    "suffix": lambda v: v not in (None, ""),
    "audio": lambda v: v is not None,
    "modalities": lambda v: v not in (None, ["text"]),
    "prediction": lambda v: v is not None,
    "web_search_options": lambda v: v is not None,
}


@dataclass(frozen=True)
class ParsedRequest:
    endpoint: str
    model: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    namespace: str
    hash_chain_block_size: int | None = None  # set when the client asked for the prompt's block hash chain
    layout: PromptLayout | None = None  # where each prompt token came from in the request (None for token ids)
    tool_choice: ToolChoice = ToolChoice("none")  # with "auto"/"required", tool calls are parsed from the output
    tool_opening: str = ""  # text the prompt put at the start of the answer to force a tool call
    retention: str | None = None  # `cache_retention`: "5m" | "1h" | "persistent"; None: the engine's default
    echo: bool = False  # completions: the text starts with the prompt,
    echo_text: str = ""  # which reads this way


# OpenAI's documented default for /v1/completions; chat completions default to the rest of the context window.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# Below this, sampling would divide logits by ~0 (overflow): treated as greedy, as vLLM does.
_GREEDY_BELOW_TEMPERATURE = 1e-5


def _prompt_token_ids(
    body: dict, endpoint: str, loaded: LoadedModel, opening: str = ""
) -> tuple[list[int], PromptLayout | None]:
    if endpoint == CHAT:
        return chat_prompt(loaded.tokenizer, body.get("messages"), check_tools(body.get("tools")), opening)
    prompt = body.get("prompt")
    if prompt is None:
        raise InvalidRequest("missing required field: prompt", param="prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        token_ids, layout = text_prompt(loaded.tokenizer, prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab_size = len(loaded.tokenizer)
        if any(not 0 <= t < vocab_size for t in prompt):
            raise InvalidRequest(f"token ids must be in [0, {vocab_size})", param="prompt")
        token_ids, layout = list(prompt), None
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise InvalidRequest("batched prompts are not supported: send one prompt per request", param="prompt")
    else:
        raise InvalidRequest("prompt must be a string, a list of token ids, or a list of one of those", param="prompt")
    if not token_ids:
        raise InvalidRequest("the prompt is empty", param="prompt")
    return token_ids, layout


def _check_model(body: dict, loaded: LoadedModel) -> str:
    model = body.get("model")
    if model is None:
        raise InvalidRequest("missing required field: model", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model must be a non-empty string", param="model")
    if not loaded.serves(model):
        shown = model if len(model) <= 200 else model[:200] + "..."
        raise ModelNotFound(shown)
    return model


@dataclass(frozen=True)
class _ToolSetup:
    """What a chat request's `tool_choice` asks of generation."""

    choice: ToolChoice = ToolChoice("none")
    opening: str = ""  # text the prompt puts at the start of the answer to force a call
    stops: tuple[str, ...] = ()  # a forced call ends at its close tag (one call per forced answer),
    closing_json: str = ""  # or where its JSON body closes, as small models often write on past it
    grammar: str | None = None  # the calls' grammar (`local_engine.engine.tool_call_grammar`), when one applies


def _tool_setup(body: dict, endpoint: str, loaded: LoadedModel) -> _ToolSetup:
    if endpoint != CHAT:
        return _ToolSetup()
    tools = check_tools(body.get("tools"))
    choice = parse_tool_choice(body.get("tool_choice"), tools)
    fmt = format_for(loaded.tokenizer)
    all_names = tuple(tool["function"]["name"] for tool in tools or ())
    if choice.mode != "required":
        schemas = argument_schemas(tools)  # the strict tools': checked whatever tool_choice says
        grammar = tool_call_grammar(fmt, all_names, schemas, "") if choice.mode == "auto" and schemas else None
        return _ToolSetup(choice, grammar=grammar)
    if choice.function is None and len(tools) == 1:
        choice = ToolChoice("required", tools[0]["function"]["name"])  # "required" with one tool names it
    # A forced call follows its function's schema, strict or not, as vLLM constrains named and required calls: the
    # grammar writes the arguments (their keys too), so the opening stops before them, or where the name starts
    # when the model picks one of several tools.
    names = (choice.function,) if choice.function else all_names
    opening = fmt.opening(choice.function)
    grammar = tool_call_grammar(fmt, names, argument_schemas(tools, names), opening)
    return _ToolSetup(choice, opening, (fmt.close_tag,), fmt.opened_json(opening), grammar)


def _grammar(tools: _ToolSetup, response_format: str | None) -> dict:
    """The grammar the output follows and the field that set it: a forced call's (`response_format` shapes text,
    not calls); with `auto`, the strict tools' unless `response_format` sets one."""
    if tools.choice.mode == "required" or response_format is None:
        return {"grammar": tools.grammar, "grammar_param": "tools"}
    return {"grammar": response_format, "grammar_param": "response_format"}


def parse_prompt(
    body: dict, endpoint: str, loaded: LoadedModel, opening: str = ""
) -> tuple[str, tuple[list[int], PromptLayout | None], str]:
    """(model, (prompt token ids, layout), cache namespace): what a dry-run match needs."""
    model = _check_model(body, loaded)
    salt = optional_str(body, "cache_salt", max_chars=1000)
    return model, _prompt_token_ids(body, endpoint, loaded, opening), salt or ""


def parse_hash_chain_request(body: dict) -> int | None:
    """`return_hash_chain: true` (with an optional `hash_block_size`, 16 by default) asks for the prompt's block
    hash chain in the `prefix_cache` object, for trace export and what-if simulation."""
    wanted = optional_bool(body, "return_hash_chain", False)
    block_size = optional_int(body, "hash_block_size", 1, MAX_BLOCK_SIZE)
    return (block_size or 16) if wanted else None


def _max_tokens(body: dict, endpoint: str, num_prompt_tokens: int, window: int, echo: bool = False) -> int:
    """`max_completion_tokens` (or its older name `max_tokens`; null is absent) or the endpoint's default. 0 only
    with `echo` (the prompt's log-likelihood, nothing generated)."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = optional_int(body, name, 0 if echo else 1, 2**31 - 1)
    if max_tokens is None:
        if endpoint == COMPLETIONS:
            return min(COMPLETIONS_DEFAULT_MAX_TOKENS, window - num_prompt_tokens)
        return window - num_prompt_tokens
    if num_prompt_tokens + max_tokens > window:
        raise InvalidRequest(
            f"{name}={max_tokens} plus the prompt's {num_prompt_tokens} tokens exceeds the context window of "
            f"{window} tokens",
            param=name,
            code="context_length_exceeded",
        )
    return max_tokens


def parse_request(body: dict, endpoint: str, loaded: LoadedModel) -> ParsedRequest:
    for name, is_set in _UNSUPPORTED_WHEN_SET.items():
        if body.get(name) is not None and is_set(body[name]):
            raise InvalidRequest(f"{name}={str(body[name])[:100]} is not supported by this engine", param=name)
    check_ignored_fields(body)
    tools = _tool_setup(body, endpoint, loaded)
    model, (token_ids, layout), namespace = parse_prompt(body, endpoint, loaded, tools.opening)
    window = loaded.context_window_tokens
    if len(token_ids) >= window:
        raise InvalidRequest(
            f"the prompt has {len(token_ids)} tokens; this model's context window is {window}",
            param="messages" if endpoint == CHAT else "prompt",
            code="context_length_exceeded",
        )
    stream = optional_bool(body, "stream", False)
    fields = parse_generation_fields(body, endpoint == CHAT, stream, loaded.vocab_size)
    max_tokens = _max_tokens(body, endpoint, len(token_ids), window, fields.echo)
    if fields.sampling["min_tokens"] > max_tokens:
        raise InvalidRequest(f"min_tokens must not exceed max_tokens ({max_tokens})", param="min_tokens")
    stream_options = optional_object(body, "stream_options")
    if stream_options is not None and not stream:
        raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")
    include_usage = (stream_options or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise InvalidRequest("stream_options.include_usage must be a boolean", param="stream_options.include_usage")
    temperature = optional_number(body, "temperature", 1.0, 0.0, 2.0)
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0 if temperature < _GREEDY_BELOW_TEMPERATURE else temperature,
        top_p=optional_number(body, "top_p", 1.0, 1e-9, 1.0),
        seed=optional_int(body, "seed", INT64_MIN, INT64_MAX),
        stop=stop_strings(body) + tools.stops,
        ignore_eos=optional_bool(body, "ignore_eos", False),
        closing_json=tools.closing_json,
        **{**fields.sampling, **_grammar(tools, fields.sampling["grammar"])},
    )
    return ParsedRequest(
        endpoint=endpoint,
        model=model,
        prompt_token_ids=tuple(token_ids),
        sampling=sampling,
        stream=stream,
        include_usage=include_usage is True,
        namespace=namespace,
        hash_chain_block_size=parse_hash_chain_request(body),
        layout=layout,
        tool_choice=tools.choice,
        tool_opening=tools.opening,
        retention=optional_choice(body, "cache_retention", RETENTION_CLASSES),
        echo=fields.echo,
        echo_text=_echo_text(body, token_ids, loaded) if fields.echo else "",
    )


def _echo_text(body: dict, token_ids: list[int], loaded: LoadedModel) -> str:
    """The prompt as sent when it was text, else its tokens decoded."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else loaded.tokenizer.decode(token_ids)
