"""Shared fixtures: SmolLM2's real tokenizer, a tiny random Llama for speed, and the real SmolLM2 when asked."""

from __future__ import annotations

import asyncio

import pytest
import torch

from local_engine.config import EngineConfig
from local_engine.engine.engine import Engine
from local_engine.model.loader import load_model, smollm2_directory, wrap_model


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        smollm2_directory(), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", local_files_only=True
    )


def build_tiny_llama(vocab_size: int, seed: int = 0, num_layers: int = 2) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=2,
        bos_token_id=1,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_loaded(smollm2_tokenizer):
    return wrap_model(build_tiny_llama(len(smollm2_tokenizer)), smollm2_tokenizer, "tiny-llama")


@pytest.fixture(scope="session")
def smollm2_loaded():
    # float32 whatever the processor: these tests compare the cache's results with a full recompute exactly, which
    # bf16 (`auto` on a CPU with native bf16) only does within its rounding.
    return load_model("smollm2", torch.device("cpu"), dtype="float32")


@pytest.fixture
def make_engine(tiny_loaded):
    """Start engines over the tiny model with the given config; all are stopped at the end of the test."""
    engines: list[Engine] = []

    def make(loaded=None, **config) -> Engine:
        engine = Engine(EngineConfig(**config), loaded or tiny_loaded)
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


async def run_to_end(engine: Engine, request):
    """Submit a request and collect (report, text, finished)."""
    handle = await engine.submit(request)
    report = handle.report.result()
    text, finished = [], None
    async for event in handle.stream():
        if hasattr(event, "text"):
            text.append(event.text)
        else:
            finished = event
    return report, "".join(text), finished


def run(coro):
    return asyncio.run(coro)
