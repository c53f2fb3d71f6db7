"""A lean forward pass for Llama-architecture models (SmolLM2, Llama, Mistral without sliding windows) over one
packed step, with fewer and larger operations than transformers' module-by-module forward.

A decode step at small batch sizes reads every weight once, and on the CPU each operation also pays a fixed cost
(dispatch, an OpenMP fork/join) that grows with the load on the machine. Per layer this forward runs one matmul for
q, k and v together and one for the MLP's gate and up projections (their weights concatenated once at start, the
model's own `nn.Linear` weights rebound as views of them so no byte is held twice), the rotary embedding of q and k
together, and residual adds in place, with no Python module calls. Cosine and sine come from the model's own rotary
module once per step, so every rope variant transformers implements for Llama is kept. Attention is the engine's
paged attention, the same function transformers calls through the registered attention interface.

In float32, RMSNorm is one fused operation (`torch.nn.functional.rms_norm`) and the rotary embedding accumulates its
second product in place: about 15 operations per layer against about 45, within 1e-4 of transformers' logits. On a CPU
with local_engine.model.cpu_kernels, a step of up to NATIVE_STEP_TOKENS tokens (a decode step, or the short prefill
chunk of a prompt whose prefix was cached; NATIVE_STEP_TOKENS_AMX where AMX attends a bf16 pool's prefill chunks,
which then takes steps that admit several such requests) calls them for the matmuls, RMSNorm, the rotary embedding (in
place in the qkv output) and silu(gate) * up instead, in float32 whether the weights are float32 or bf16; those chunks'
attention rounds its queries and probabilities to bf16 as SDPA on the bf16 pool does. A bf16 model's step of up
to `cpu_kernels.max_rows` rows (4, or 8 on the kernels' 512-bit path) then rounds only the K/V it stores (within 0.002
of the float32 forward on the same weights, a fifth to a third of transformers' bf16 forward's distance:
tests/local_engine/test_fused_llama.py); with more rows its matmuls take oneDNN's bf16 GEMM on rows rounded to bf16
(local_engine.model.packed_linear), so a row's last bits depend on how many rows share its step. A decode step whose
rows the CPU kernels attend all (no prefill chunk beside them), of up to the weights' `cpu_kernels.max_rows`, runs
every decoder layer in one `cpu_kernels.decode_layers` call: the same kernels in the same order, with no return to
Python between them (SmolLM2 in bf16, one row on a 2,000-token context: 14.2-16.4 ms a step, against 18.0-18.5
operation by operation).
Otherwise, in bfloat16 on the CPU every elementwise step rounds where transformers' forward rounds (RMSNorm in
float32, rounded to bf16 before the weight; rotary as `q * cos + rotate_half(q) * sin`, each product rounded), a fused
matmul gives each output the value the separate projections give, and the matmuls run on weights oneDNN has packed
once at start (local_engine.model.packed_linear), which give the same values without a reorder of every weight in
every step: the logits are transformers' bit for bit (tests/local_engine/test_fused_llama.py; on a CPU with AMX, for
steps of up to 32 tokens, beyond which a packed matmul may round one bf16 step apart:
local_engine.model.packed_linear), and on SmolLM2 with a 1.8k-token context a one-token step took 56 ms of CPU time
against 77 (one thread, machine load 6).
bf16 on CUDA keeps transformers' forward, whose cuBLAS kernels may round a fused matmul differently.

Models outside its scope (biases on the projections, q/k norms, sliding windows, other block layouts) keep the
transformers forward: `FusedLlamaForward.supports` says which.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F

from local_engine.model import cpu_kernels
from local_engine.model.packed_linear import PackedLinear
from local_engine.model.weight_arena import WeightArena

_SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM")
# Steps of up to this many tokens run the CPU kernels' elementwise steps, on one thread, in float32: decode steps and
# the short chunk a prompt whose prefix was cached still prefills. SmolLM2 in bf16, 25 new tokens after 2,048 cached:
# 50.5 ms a step against 54.9 with transformers' rounding operation by operation (2-core Xeon).
NATIVE_STEP_TOKENS = 64
# Where AMX attends the prefill chunks of a bf16 pool (cpu_kernels.chunk_attention, which takes float32 queries),
# steps of up to this many (decode batches of up to 256 rows and short prompts too): SmolLM2, 8 requests of 25 new
# tokens after 2,048 cached each (the step that admits a batch of requests on cached prompts) took 149-153 ms against
# 222-237 with transformers' rounding, where without AMX the native path gained nothing (228-240 ms either way;
# 2-core Xeon).
NATIVE_STEP_TOKENS_AMX = 256
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its FusedLlamaForward


def native_step_tokens(pool_k: torch.Tensor) -> int:
    """The most tokens a step on a pool layer like `pool_k` runs on the CPU kernels: NATIVE_STEP_TOKENS_AMX where AMX
    attends its prefill chunks, else NATIVE_STEP_TOKENS."""
    return NATIVE_STEP_TOKENS_AMX if cpu_kernels.chunk_attends(pool_k) else NATIVE_STEP_TOKENS


class _Layer:
    """One decoder layer's tensors: RMSNorm weights, the fused qkv and gate_up weights, o and down projections."""

    def __init__(self, layer: torch.nn.Module, arena: WeightArena | None) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm = layer.input_layernorm.weight
        self.post_norm = layer.post_attention_layernorm.weight
        self.eps = layer.input_layernorm.variance_epsilon
        self.qkv = PackedLinear(_fuse(arena, attn.q_proj, attn.k_proj, attn.v_proj))
        self.gate_up = PackedLinear(_fuse(arena, mlp.gate_proj, mlp.up_proj))
        self.o = PackedLinear(_fuse(arena, attn.o_proj))
        self.down = PackedLinear(_fuse(arena, mlp.down_proj))
        self.act = mlp.act_fn
        self.scaling = attn.scaling


def _fuse(arena: WeightArena | None, *linears: torch.nn.Linear) -> torch.Tensor:
    """The linears' weights stacked (`[sum of out_features, in_features]`), in `arena` when given; each linear's
    weight becomes a view of its rows, so the model keeps working and the old tensors are freed. A single linear
    keeps its own weight without an arena."""
    if len(linears) == 1 and arena is None:
        return linears[0].weight
    fused = torch.cat([linear.weight.detach() for linear in linears]).contiguous()
    if arena is not None:
        fused = arena.take(fused)
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight = torch.nn.Parameter(fused[start : start + rows], requires_grad=False)
        start += rows
    return fused


def _weight_arena(model: torch.nn.Module, layers: list[torch.nn.Module]) -> WeightArena | None:
    """An arena for every matmul weight of a model on the CPU whose decode steps run on the CPU kernels (their reads
    stream every weight once per step: local_engine.model.weight_arena), else None."""
    if next(model.parameters()).device.type != "cpu" or not cpu_kernels.available():
        return None
    weights = [model.lm_head.weight] + [linear.weight for layer in layers
                                        for linear in (*_projections(layer.self_attn), *_projections(layer.mlp))]
    return WeightArena(WeightArena.size_for(weights))


def _projections(module: torch.nn.Module) -> list[torch.nn.Linear]:
    """The linear layers directly under an attention or MLP module."""
    return [child for child in module.children() if isinstance(child, torch.nn.Linear)]


class FusedLlamaForward:
    """Runs a Llama-architecture causal LM over a packed step with an attention function of the engine's shape."""

    def __init__(self, model: torch.nn.Module) -> None:
        """Raises ValueError for a model `supports` rejects."""
        if not self.supports(model):
            raise ValueError(f"{type(model).__name__} is not a plain Llama-architecture model")
        config = model.config.get_text_config(decoder=True)
        inner = model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = inner.norm.weight
        self.norm_eps = inner.norm.variance_epsilon
        decoder_layers = inner.layers[: config.num_hidden_layers]
        self.kernels = cpu_kernels.available()  # whether this forward was built on the CPU kernels
        arena = _weight_arena(model, decoder_layers)
        if arena is not None:  # the head, and the embedding when it is tied to it
            tied = inner.embed_tokens.weight is model.lm_head.weight
            model.lm_head.weight = torch.nn.Parameter(arena.take(model.lm_head.weight.detach()), requires_grad=False)
            if tied:
                inner.embed_tokens.weight = model.lm_head.weight
        self.lm_head = PackedLinear(model.lm_head.weight)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.hidden = config.hidden_size
        self.swiglu = getattr(config, "hidden_act", None) == "silu"  # silu(gate) * up, the CPU kernels' MLP
        self.layers = [_Layer(layer, arena) for layer in decoder_layers]
        # Steps of up to `native_tokens` (a call's argument) run on the CPU kernels, in float32 whatever the weights'
        # dtype, where they serve every matmul and the rotary embedding covers the whole head.
        linears = [self.lm_head] + [linear for layer in self.layers
                                    for linear in (layer.qkv, layer.gate_up, layer.o, layer.down)]
        rotary_dim = 2 * self.rotary.inv_freq.shape[-1] if hasattr(self.rotary, "inv_freq") else None
        self.native = all(linear.native for linear in linears) and rotary_dim == self.head_dim
        # A decode step whose rows are all attended by the CPU kernels runs every layer in one kernel call.
        self.decoder_layers = cpu_kernels.DecoderLayers.of(
            [(layer.input_norm, layer.post_norm, layer.qkv.weight, layer.o.weight, layer.gate_up.weight,
              layer.down.weight) for layer in self.layers],
            self.num_heads, self.num_kv_heads, self.head_dim, [layer.eps for layer in self.layers],
            [layer.scaling for layer in self.layers],
        ) if self.native and self.swiglu else None

    @classmethod
    def of(cls, model: torch.nn.Module) -> FusedLlamaForward:
        """The model's FusedLlamaForward, built (its weights fused) once however many engines run the model, unless
        the CPU kernels were switched on or off since."""
        built = _BUILT.get(model)
        # Built again where the CPU kernels were switched on or off since (cpu_kernels.set_mode): which matmuls and
        # elementwise steps a forward calls is settled when it is built.
        if built is None or built.kernels != cpu_kernels.available():
            built = _BUILT[model] = cls(model)
        return built

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        """Whether `model` is a Llama-architecture LM this forward computes: float32 weights, or bfloat16 weights on
        the CPU; no projection biases, no sliding window, the standard RMSNorm and rotary modules."""
        if type(model).__name__ not in _SUPPORTED:
            return False
        parameter = next(model.parameters())
        if parameter.dtype != torch.float32 and (parameter.dtype, parameter.device.type) != (torch.bfloat16, "cpu"):
            return False
        config = model.config.get_text_config(decoder=True)
        if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
            return False
        if getattr(config, "sliding_window", None):
            return False
        inner = getattr(model, "model", None)
        return inner is not None and all(hasattr(inner, name) for name in ("embed_tokens", "rotary_emb", "norm"))

    def __call__(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        keep: torch.Tensor,
        attention: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor],
        decode: cpu_kernels.DecodeStep | None = None,
        native_tokens: int = NATIVE_STEP_TOKENS,
    ) -> torch.Tensor:
        """`input_ids`, `position_ids`: int64 `[num_tokens]`; `keep`: int64 `[num_kept]`, the rows whose logits are
        wanted; `attention(layer, q, k, v, scaling)` with q `[1, num_heads, num_tokens, head_dim]` and k, v
        `[1, num_kv_heads, num_tokens, head_dim]` returns `[1, num_tokens, num_heads, head_dim]`. `decode`: given
        when every token is a decode row the CPU kernels attend; up to `max_rows` of the weights (4 or 8 in bf16, 16
        in float32) the layers then run in one `cpu_kernels.decode_layers` call, which computes what the per-operation
        path computes on the same kernels. `native_tokens`: the most tokens a step may have to run on the CPU kernels
        (`native_step_tokens` of the pool).
        Returns logits `[num_kept, vocab]` in the model's dtype, or float32 from a step on the CPU kernels."""
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        num_tokens = input_ids.shape[0]
        hidden = self.embed(input_ids)  # [T, hidden], a new tensor: residual adds go in place
        native = self.native and num_tokens <= native_tokens
        if native:
            hidden = hidden.float()  # a bf16 model's decode step too: only the stored K/V are rounded to bf16
        cos, sin = self.rotary(hidden, position_ids.unsqueeze(0))  # [1, T, head_dim]
        if decode is not None and self.decoder_layers is not None and num_tokens <= self.decoder_layers.max_rows:
            cpu_kernels.decode_layers(hidden, self.decoder_layers, decode, cos[0], sin[0])
            return self.lm_head(cpu_kernels.rms_norm(hidden.index_select(0, keep), self.norm, self.norm_eps))
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [T, 1, head_dim]
        rounded = hidden.dtype != torch.float32  # round where transformers' forward rounds
        if native:
            norm, activate = cpu_kernels.rms_norm, (_native_swiglu if self.swiglu else _swiglu)

            def rotate(qkv: torch.Tensor) -> torch.Tensor:
                cpu_kernels.rotate_(qkv, cos[:, 0], sin[:, 0], heads + kv_heads)
                return qkv
        else:
            norm, activate = (_rms_norm_rounded if rounded else _rms_norm), _swiglu
            rotate_part = _rotate_rounded if rounded else _rotate

            def rotate(qkv: torch.Tensor) -> torch.Tensor:
                return rotate_part(qkv[:, : heads + kv_heads], cos, sin)
        for index, layer in enumerate(self.layers):
            x = norm(hidden, layer.input_norm, layer.eps)
            qkv = layer.qkv(x).view(num_tokens, heads + 2 * kv_heads, head_dim)
            rotated = rotate(qkv)  # q and k rotated: heads [0, heads + kv_heads)
            q = rotated[:, :heads].transpose(0, 1).unsqueeze(0)
            k = rotated[:, heads : heads + kv_heads].transpose(0, 1).unsqueeze(0)
            v = qkv[:, heads + kv_heads :].transpose(0, 1).unsqueeze(0)
            attended = attention(index, q, k, v, layer.scaling).reshape(num_tokens, heads * head_dim)
            hidden.add_(layer.o(attended))
            x = norm(hidden, layer.post_norm, layer.eps)
            hidden.add_(layer.down(activate(layer, layer.gate_up(x))))
        kept = norm(hidden.index_select(0, keep), self.norm, self.norm_eps)
        return self.lm_head(kept)


def _swiglu(layer: _Layer, gate_up: torch.Tensor) -> torch.Tensor:
    """The MLP's `act(gate) * up` from the fused projection's `[T, 2 * intermediate]`."""
    gate, up = gate_up.chunk(2, dim=-1)
    return layer.act(gate).mul_(up)


def _native_swiglu(layer: _Layer, gate_up: torch.Tensor) -> torch.Tensor:
    """`_swiglu` for a SiLU activation, in one CPU kernel call (float32)."""
    return cpu_kernels.silu_mul(gate_up)


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of `hidden` `[T, hidden]` over its last dimension, one fused operation (float32 models)."""
    return F.rms_norm(hidden, weight.shape, weight, eps)


def _rms_norm_rounded(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm, operation for operation: normalized in float32, rounded to the input's dtype, then
    scaled by the weight in that dtype."""
    x = hidden.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(hidden.dtype)


def _rotate(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of `qk` `[T, heads, head_dim]` by `cos`, `sin` `[T, 1, head_dim]` in three operations
    (float32 models): `qk * cos + rotate_half(qk) * sin`, the second product accumulated in place."""
    half = qk.shape[-1] // 2
    rotated = qk * cos
    rotated[..., :half].addcmul_(qk[..., half:], sin[..., :half], value=-1.0)
    rotated[..., half:].addcmul_(qk[..., :half], sin[..., half:])
    return rotated


def _rotate_rounded(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`qk * cos + rotate_half(qk) * sin` with each product rounded to `qk`'s dtype, as transformers computes it."""
    half = qk.shape[-1] // 2
    rotated = qk * cos
    rotated += torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
    return rotated
