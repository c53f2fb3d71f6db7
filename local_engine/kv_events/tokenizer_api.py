"""`GET /v1/tokenizer`: the served model's tokenizer (`tokenizer.json` text), chat template and special tokens, so a
router in front of this engine tokenizes requests exactly as the engine does (`gateway/replicas/request_tokens.py`)
and matches them against the token ids of the KV events."""

from __future__ import annotations

from litestar import get
from litestar.datastructures import State

from local_engine.errors import EngineError


class TokenizerNotServed(EngineError):
    status_code = 404
    error_type = "not_found_error"


_DESCRIBED: dict[int, dict] = {}  # id(tokenizer) -> description (serializing the vocabulary takes a while)


def _describe(tokenizer) -> dict:
    if id(tokenizer) in _DESCRIBED:
        return _DESCRIBED[id(tokenizer)]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerNotServed("this model's tokenizer is not a fast (tokenizers) one, so it cannot be served")
    description = _DESCRIBED[id(tokenizer)] = {
        "tokenizer": backend.to_str(),
        "chat_template": getattr(tokenizer, "chat_template", None),
        "bos_token": getattr(tokenizer, "bos_token", None),
        "eos_token": getattr(tokenizer, "eos_token", None),
    }
    return description


@get("/v1/tokenizer")
async def tokenizer_description(state: State) -> dict:
    """`{model, tokenizer (tokenizer.json text), chat_template, bos_token, eos_token}`; 404 for a slow tokenizer."""
    loaded = state.engine.loaded
    return {"model": loaded.model_id, **_describe(loaded.tokenizer)}
