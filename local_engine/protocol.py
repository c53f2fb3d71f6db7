"""OpenAI request bodies to engine requests, with a clear 400 for everything the engine cannot honour."""

from __future__ import annotations

import json
from dataclasses import dataclass

from local_engine.cache.hash_chain import MAX_BLOCK_SIZE
from local_engine.chat_prompt import chat_prompt, text_prompt
from local_engine.errors import InvalidRequest
from local_engine.model_loader import LoadedModel
from local_engine.prompt_layout import PromptLayout
from local_engine.sampling import SamplingParams

CHAT = "chat.completions"
COMPLETIONS = "completions"

# Parameters an OpenAI client may send that this engine cannot honour: refuse rather than silently ignore.
_UNSUPPORTED_WHEN_SET = {
    "logprobs": lambda v: bool(v),
    "top_logprobs": lambda v: v not in (None, 0),
    "logit_bias": lambda v: bool(v),
    "presence_penalty": lambda v: v not in (None, 0, 0.0),
    "frequency_penalty": lambda v: v not in (None, 0, 0.0),
    "echo": lambda v: bool(v),
    "best_of": lambda v: v not in (None, 1),
    "suffix": lambda v: v not in (None, ""),
    "n": lambda v: v not in (None, 1),
    "response_format": lambda v: v not in (None, {"type": "text"}),
    "tool_choice": lambda v: v not in (None, "auto", "none"),
    "audio": lambda v: v is not None,
    "modalities": lambda v: v not in (None, ["text"]),
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


def parse_json_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be a number between {low} and {high}", param=name)
    return float(value)


def _stop_strings(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise InvalidRequest("stop must be a string or a list of at most 4 strings", param="stop")


def _prompt_token_ids(body: dict, endpoint: str, loaded: LoadedModel) -> tuple[list[int], PromptLayout | None]:
    if endpoint == CHAT:
        if "messages" not in body:
            raise InvalidRequest("missing required field: messages", param="messages")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise InvalidRequest("tools must be a list", param="tools")
        return chat_prompt(loaded.tokenizer, body["messages"], tools)
    if "prompt" not in body:
        raise InvalidRequest("missing required field: prompt", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        token_ids, layout = text_prompt(loaded.tokenizer, prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab_size = len(loaded.tokenizer)
        if any(not 0 <= t < vocab_size for t in prompt):
            raise InvalidRequest(f"token ids must be in [0, {vocab_size})", param="prompt")
        token_ids, layout = list(prompt), None
    elif isinstance(prompt, list):
        raise InvalidRequest("batched prompts are not supported: send one prompt per request", param="prompt")
    else:
        raise InvalidRequest("prompt must be a string or a list of token ids", param="prompt")
    if not token_ids:
        raise InvalidRequest("the prompt is empty", param="prompt")
    return token_ids, layout


def _check_model(body: dict, loaded: LoadedModel) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("missing required field: model", param="model")
    if not loaded.serves(model):
        raise InvalidRequest(
            f"The model `{model}` does not exist; this engine serves `{loaded.model_id}`",
            param="model",
            code="model_not_found",
        )
    return model


def parse_prompt(
    body: dict, endpoint: str, loaded: LoadedModel
) -> tuple[str, tuple[list[int], PromptLayout | None], str]:
    """(model, (prompt token ids, layout), cache namespace): what a dry-run match needs."""
    model = _check_model(body, loaded)
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise InvalidRequest("cache_salt must be a string", param="cache_salt")
    return model, _prompt_token_ids(body, endpoint, loaded), salt or ""


def parse_hash_chain_request(body: dict) -> int | None:
    """`return_hash_chain: true` (with an optional `hash_block_size`, 16 by default) asks for the prompt's block
    hash chain in the `prefix_cache` object, for trace export and what-if simulation."""
    wanted = body.get("return_hash_chain", False)
    if not isinstance(wanted, bool):
        raise InvalidRequest("return_hash_chain must be a boolean", param="return_hash_chain")
    block_size = body.get("hash_block_size", 16)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise InvalidRequest(f"hash_block_size must be an integer in [1, {MAX_BLOCK_SIZE}]", param="hash_block_size")
    return block_size if wanted else None


def parse_request(body: dict, endpoint: str, loaded: LoadedModel) -> ParsedRequest:
    for name, is_set in _UNSUPPORTED_WHEN_SET.items():
        if name in body and is_set(body[name]):
            raise InvalidRequest(f"{name}={body[name]!r} is not supported by this engine", param=name)
    model, (token_ids, layout), namespace = parse_prompt(body, endpoint, loaded)
    window = loaded.context_window_tokens
    if len(token_ids) >= window:
        raise InvalidRequest(
            f"the prompt has {len(token_ids)} tokens; this model's context window is {window}",
            param="messages" if endpoint == CHAT else "prompt",
            code="context_length_exceeded",
        )
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = window - len(token_ids)
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        raise InvalidRequest("max_tokens must be a positive integer", param="max_tokens")
    elif len(token_ids) + max_tokens > window:
        raise InvalidRequest(
            f"max_tokens={max_tokens} plus the prompt's {len(token_ids)} tokens exceeds the context window of "
            f"{window} tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidRequest("seed must be an integer", param="seed")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("stream must be a boolean", param="stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise InvalidRequest("stream_options must be an object", param="stream_options")
    if body.get("stream_options") is not None and not stream:
        raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
        seed=seed,
        stop=_stop_strings(body),
        ignore_eos=bool(body.get("ignore_eos", False)),
    )
    return ParsedRequest(
        endpoint=endpoint,
        model=model,
        prompt_token_ids=tuple(token_ids),
        sampling=sampling,
        stream=stream,
        include_usage=bool(stream_options.get("include_usage", False)),
        namespace=namespace,
        hash_chain_block_size=parse_hash_chain_request(body),
        layout=layout,
    )
