"""Test support for replica sets: a tiny random Llama saved as a model directory (with SmolLM2's real tokenizer), and
engine processes serving it that can be killed and restarted on the same port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from gateway_testkit import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def save_tiny_model(directory: Path) -> Path:
    """A 2-layer random Llama (hidden size 64) with SmolLM2's tokenizer and chat template, as `prefixscope engine
    --model DIR` loads it: fast enough to run several engines on a CPU."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from local_engine.model.loader import smollm2_directory

    tokenizer = AutoTokenizer.from_pretrained(
        smollm2_directory(), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", local_files_only=True
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class EngineProcess:
    """`prefixscope engine` on a free port (or a given one); `kill` and `restart` keep the port."""

    def __init__(self, model: str, *options: str, port: int | None = None) -> None:
        self.model = model
        self.options = options
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._log = Path(os.environ.get("TMPDIR", "/tmp")) / f"replica-test-engine-{self.port}.log"
        self.start()

    def start(self) -> None:
        command = [sys.executable, "-m", "prefixscope", "engine", "--model", self.model, "--device", "cpu"]
        command += ["--port", str(self.port), "--log-level", "warning", *self.options]
        with open(self._log, "ab") as log:
            self._process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout_s: float = 300.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"the engine exited with {self._process.returncode}; see {self._log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the engine did not become healthy")
            time.sleep(0.3)

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=30)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=30)
