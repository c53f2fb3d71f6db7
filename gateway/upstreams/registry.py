"""Kind name -> adapter instance."""

from __future__ import annotations

from gateway.upstreams.base import UpstreamAdapter
from gateway.upstreams.kinds import (
    AnthropicAdapter,
    LocalEngineAdapter,
    OpenAICompatibleAdapter,
    SGLangAdapter,
    VLLMAdapter,
)

_ADAPTERS: dict[str, UpstreamAdapter] = {
    "local_engine": LocalEngineAdapter(),
    "openai": OpenAICompatibleAdapter(),
    "vllm": VLLMAdapter(),
    "sglang": SGLangAdapter(),
    "anthropic": AnthropicAdapter(),
}


def adapter_for(kind: str) -> UpstreamAdapter:
    try:
        return _ADAPTERS[kind]
    except KeyError:
        raise ValueError(f"unknown upstream kind {kind!r}; known: {sorted(_ADAPTERS)}") from None
