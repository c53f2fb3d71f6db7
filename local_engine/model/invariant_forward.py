"""The batch-invariant forward pass: a Llama-architecture model over one packed step in which every token's result
depends only on the token and its context, never on the step around it.

Every operation is either row by row in a fixed order or elementwise: the embedding lookup (widened to float32), the
CPU kernels' RMSNorm (one fixed sum per row), the batch-invariant matmul (local_engine.model.invariant_kernels,
`PanelWeight`), the rotary embedding from a table of every position's cos and sin computed once (so a position's
values never depend on which other positions a step holds), the new K/V stored into the pool, the batch-invariant
attention over each row's own context, silu(gate) * up, and residual adds. Nothing takes another path for a larger or
smaller step: there is no decode-only shortcut, no shared-prefix grouping, no oneDNN or MKL GEMM (whose blocking, and
so whose sums, change with the number of rows).

Hence, in float32 or with bfloat16 weights and pool (computed in float32, the K/V rounded to bfloat16 once when
stored), a prompt's logits and K/V are identical bit for bit whether it was computed cold in chunks of any size,
partly or fully from the cache, from the host or disk tier (which keep the K/V's bytes), or at any batch
composition: tests/local_engine/test_batch_invariance.py.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import torch

from local_engine.model import cpu_kernels, invariant_kernels
from local_engine.model.fused_llama import FusedLlamaForward
from local_engine.model.invariant_kernels import PanelWeight

# rope types whose cos and sin depend on the position alone (not on the sequence's length, as "dynamic" does)
_STATIC_ROPE = ("default", "linear", "llama3", "yarn", "longrope_static")
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its InvariantLlamaForward
_BUILDING = threading.Lock()

# `attention(layer, q, k, v, scale)` with q `[T, heads, head_dim]`, k and v `[T, kv_heads, head_dim]` (float32 views
# of the step's qkv output) returns float32 `[T, heads, head_dim]`, contiguous.
Attention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


class _Layer:
    """One decoder layer's RMSNorm weights and its four matmuls as panels."""

    def __init__(self, fused_layer) -> None:
        self.input_norm, self.post_norm, self.eps = fused_layer.input_norm, fused_layer.post_norm, fused_layer.eps
        self.qkv = PanelWeight(fused_layer.qkv.weight)
        self.o = PanelWeight(fused_layer.o.weight)
        self.gate_up = PanelWeight(fused_layer.gate_up.weight)
        self.down = PanelWeight(fused_layer.down.weight)
        self.scaling = fused_layer.scaling


class InvariantLlamaForward:
    """Runs a Llama-architecture model FusedLlamaForward supports, on the CPU kernels, batch-invariantly. The weights
    are packed into panels once (a second copy of the matmul weights, in their dtype)."""

    def __init__(self, model: torch.nn.Module) -> None:
        """Raises ValueError for a model `supports` rejects."""
        if not self.supports(model):
            raise ValueError(f"{type(model).__name__} cannot run batch-invariantly here")
        fused = FusedLlamaForward.of(model)
        self.embed, self.rotary = fused.embed, fused.rotary
        self.norm, self.norm_eps = fused.norm, fused.norm_eps
        self.heads, self.kv_heads, self.head_dim = fused.num_heads, fused.num_kv_heads, fused.head_dim
        self.layers = [_Layer(layer) for layer in fused.layers]
        self.lm_head = PanelWeight(fused.lm_head.weight)
        self._cos = self._sin = torch.empty(0, self.head_dim)
        self._table_lock = threading.Lock()

    @classmethod
    def of(cls, model: torch.nn.Module) -> InvariantLlamaForward:
        """The model's InvariantLlamaForward, packed once however many engines run the model."""
        with _BUILDING:
            built = _BUILT.get(model)
            if built is None:
                built = _BUILT[model] = cls(model)
            return built

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        """Whether `model` runs batch-invariantly here: a model FusedLlamaForward computes, on the CPU, in float32 or
        bfloat16, with a SiLU MLP, a rotary embedding over the whole head that depends on the position alone, an
        attention shape the invariant kernels take, and the CPU kernels available."""
        if not FusedLlamaForward.supports(model) or next(model.parameters()).device.type != "cpu":
            return False
        config = model.config.get_text_config(decoder=True)
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        rotary = model.model.rotary_emb
        rotary_dim = 2 * rotary.inv_freq.shape[-1] if hasattr(rotary, "inv_freq") else None
        return (getattr(config, "hidden_act", None) == "silu" and rotary_dim == head_dim
                and getattr(rotary, "rope_type", "default") in _STATIC_ROPE
                and invariant_kernels.runs(next(model.parameters()).dtype, head_dim, heads, kv_heads))

    def _rotary(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, contiguous float32 `[T, head_dim]`, looked up in the table of every position up to the
        largest seen; a position's row is computed once, when the table first reaches it, and never again."""
        end = int(position_ids.max()) + 1
        if end > len(self._cos):
            with self._table_lock:
                start = len(self._cos)
                if end > start:
                    size = max(end, 2 * start, 4096)
                    positions = torch.arange(start, size, dtype=torch.int64).unsqueeze(0)
                    cos, sin = self.rotary(torch.zeros(1, dtype=torch.float32), positions)  # [1, new, head_dim]
                    self._cos = torch.cat([self._cos, cos[0].float()])
                    self._sin = torch.cat([self._sin, sin[0].float()])
        return self._cos.index_select(0, position_ids), self._sin.index_select(0, position_ids)

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor,
                 attention: Attention) -> torch.Tensor:
        """`input_ids`, `position_ids`: int64 `[num_tokens]`; `keep`: int64 `[num_kept]`, the rows whose logits are
        wanted; `attention` as the module's `Attention` (it stores the step's K/V and attends). Returns float32
        logits `[num_kept, vocab]`."""
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        num_tokens = input_ids.shape[0]
        hidden = self.embed(input_ids).float()  # [T, hidden], a new tensor: residual adds go in place
        cos, sin = self._rotary(position_ids)
        for index, layer in enumerate(self.layers):
            qkv = layer.qkv(cpu_kernels.rms_norm(hidden, layer.input_norm, layer.eps))
            qkv = qkv.view(num_tokens, heads + 2 * kv_heads, head_dim)
            cpu_kernels.rotate_(qkv, cos, sin, heads + kv_heads)  # q and k: heads [0, heads + kv_heads)
            attended = attention(index, qkv[:, :heads], qkv[:, heads : heads + kv_heads],
                                 qkv[:, heads + kv_heads :], layer.scaling)
            hidden.add_(layer.o(attended.view(num_tokens, heads * head_dim)))
            gate_up = layer.gate_up(cpu_kernels.rms_norm(hidden, layer.post_norm, layer.eps))
            hidden.add_(layer.down(cpu_kernels.silu_mul(gate_up)))
        return self.lm_head(cpu_kernels.rms_norm(hidden.index_select(0, keep), self.norm, self.norm_eps))


def step_attention(pool_k: torch.Tensor, pool_v: torch.Tensor, tables: list[torch.Tensor],
                   num_query_tokens: list[int]) -> Attention:
    """The `Attention` of one packed step over the pool `pool_k`, `pool_v` (`[num_layers, num_slots, kv_heads,
    head_dim]`, float32 or bfloat16 on the CPU): sequence i, in packed order, has slot table `tables[i]` (int64 CPU,
    up to and including its tokens in the step) and `num_query_tokens[i]` tokens in the step. Each layer's call
    stores the step's K/V at their slots (rounded as torch's `.to` rounds) and attends every row to its context.
    Raises ValueError as `invariant_kernels.plan_attention` does."""
    plan = invariant_kernels.plan_attention(tables, num_query_tokens)
    write_slots = torch.cat([table[len(table) - n :] for table, n in zip(tables, num_query_tokens)])

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        layer_k, layer_v = pool_k[layer], pool_v[layer]
        cpu_kernels.store(layer_k, write_slots, k)
        cpu_kernels.store(layer_v, write_slots, v)
        out = torch.empty(q.shape, dtype=torch.float32)
        invariant_kernels.attention(q, layer_k, layer_v, plan, scale, out)
        return out

    return attend
