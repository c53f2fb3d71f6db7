"""The only module that touches transformers' cache internals.

A request's working KV lives in one preallocated buffer per request (`WorkingKV`): the matched prefix is gathered
into it from the KV pool, the model appends the suffix and every decoded token in place (no per-step concatenation),
and at the end the newly computed part is scattered back into pool slots for the radix tree to index. A paged
attention kernel reading the pool directly could later replace the gather without touching the tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from local_engine.cache import KVPool, KVPoolConfig


class _InPlaceLayer(CacheLayerMixin):
    """One layer's K/V as views of `[1, num_kv_heads, capacity, head_dim]` buffers, appended to in place."""

    is_sliding = False

    def __init__(self, keys_buffer: torch.Tensor, values_buffer: torch.Tensor, length: int) -> None:
        super().__init__()
        self._keys_buffer = keys_buffer
        self._values_buffer = values_buffer
        self.device = keys_buffer.device
        self.length = length
        self.is_initialized = True
        self._refresh_views()

    def _refresh_views(self) -> None:
        self.keys = self._keys_buffer[:, :, : self.length]
        self.values = self._values_buffer[:, :, : self.length]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # buffers exist from the start

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # key_states: [1, num_kv_heads, new_tokens, head_dim]
        end = self.length + key_states.shape[-2]
        self._keys_buffer[:, :, self.length : end] = key_states
        self._values_buffer[:, :, self.length : end] = value_states
        self.length = end
        self._refresh_views()
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self._keys_buffer.shape[-2]


class WorkingKV(Cache):
    """The model-facing cache object of one request: `[num_layers, 1, num_kv_heads, capacity, head_dim]` buffers."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        self.keys_buffer = keys
        self.values_buffer = values
        super().__init__(layers=[_InPlaceLayer(keys[i], values[i], length) for i in range(keys.shape[0])])

    @property
    def num_tokens(self) -> int:
        return self.layers[0].length

    @property
    def capacity_tokens(self) -> int:
        return self.keys_buffer.shape[-2]


@dataclass(frozen=True)
class StepOutput:
    """Logits for the next token, `[vocab]` (or `[num_new_tokens, vocab]` when all positions were asked for)."""

    logits: torch.Tensor


class ModelRunner:
    """Runs a causal LM on top of KV gathered from the pool, and writes new KV back into the pool."""

    def __init__(self, model: torch.nn.Module, pool: KVPool, max_idle_buffers: int = 4) -> None:
        self.model = model
        self.pool = pool
        self.device = pool.k.device
        self.dtype = pool.k.dtype
        # Working buffers and the gather scratch are reused across requests: a fresh multi-megabyte allocation
        # is page-faulted in on first touch, which costs more than the copy itself.
        self._idle_buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._max_idle_buffers = max_idle_buffers
        self._gather_scratch = torch.empty(0, dtype=self.dtype, device=self.device)
        if self.device.type == "cpu":
            # A suffix prefilled on top of cached KV needs a causal mask with an offset, and with a mask transformers
            # repeats K/V per query head in every layer (megabytes per layer at a 2k-token prefix) instead of
            # letting SDPA share them. PyTorch's CPU kernel does grouped-query attention with a mask, exactly.
            os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")

    @staticmethod
    def pool_config_for(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> KVPoolConfig:
        config = model.config.get_text_config(decoder=True)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return KVPoolConfig(config.num_hidden_layers, num_kv_heads, head_dim, dtype, device)

    def new_working_kv(self, prefix_slots: torch.Tensor, capacity_tokens: int) -> WorkingKV:
        """A request's working cache holding the KV of `prefix_slots` (int64 `[m]`), room for `capacity_tokens`."""
        keys, values = self._acquire_buffers(capacity_tokens)
        matched = int(prefix_slots.numel())
        if matched:
            index = prefix_slots.to(self.device)
            for pool_tensor, buffer in ((self.pool.k, keys), (self.pool.v, values)):
                gathered = self._scratch(pool_tensor.shape[0], matched)  # [L, m, H, D]
                torch.index_select(pool_tensor, 1, index, out=gathered)
                buffer[:, 0, :, :matched].copy_(gathered.transpose(1, 2))
        return WorkingKV(keys, values, matched)

    def release(self, working: WorkingKV) -> None:
        """Keep a finished request's buffers for the next one."""
        self._idle_buffers.append((working.keys_buffer, working.values_buffer))
        if len(self._idle_buffers) > self._max_idle_buffers:
            self._idle_buffers.pop(0)

    def _acquire_buffers(self, capacity_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        fitting = [i for i, pair in enumerate(self._idle_buffers) if pair[0].shape[-2] >= capacity_tokens]
        if fitting:
            # By position: comparing tuples of tensors with == would compare their contents.
            best = min(fitting, key=lambda i: self._idle_buffers[i][0].shape[-2])
            return self._idle_buffers.pop(best)
        config = self.pool.config
        rounded = -(-capacity_tokens // 256) * 256  # round up so similar requests can share buffers
        shape = (config.num_layers, 1, config.num_kv_heads, rounded, config.head_dim)
        return (
            torch.empty(shape, dtype=self.dtype, device=self.device),
            torch.empty(shape, dtype=self.dtype, device=self.device),
        )

    def _scratch(self, num_layers: int, num_tokens: int) -> torch.Tensor:
        config = self.pool.config
        shape = (num_layers, num_tokens, config.num_kv_heads, config.head_dim)
        needed = num_layers * num_tokens * config.num_kv_heads * config.head_dim
        if self._gather_scratch.numel() < needed:
            self._gather_scratch = torch.empty(needed, dtype=self.dtype, device=self.device)
        return self._gather_scratch[:needed].view(shape)

    @torch.inference_mode()
    def forward(self, working: WorkingKV, token_ids: list[int], *, all_logits: bool = False) -> StepOutput:
        """Run `token_ids` after the tokens already in `working`; returns the last position's logits (fp32)."""
        start = working.num_tokens
        if start + len(token_ids) > working.capacity_tokens:
            raise ValueError("working KV is full")
        input_ids = torch.tensor([token_ids], dtype=torch.int64, device=self.device)
        position_ids = torch.arange(start, start + len(token_ids), device=self.device).unsqueeze(0)
        output = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            cache=working,
            use_cache=True,
            logits_to_keep=0 if all_logits else 1,
        )
        logits = output.logits[0].float()
        return StepOutput(logits if all_logits else logits[-1])

    def write_back(self, working: WorkingKV, start: int, end: int, slots: torch.Tensor) -> None:
        """Scatter positions `[start, end)` of `working` into pool `slots` (int64 `[end - start]`)."""
        if end <= start:
            return
        keys = working.keys_buffer[:, 0, :, start:end].transpose(1, 2)  # [L, n, H, D]
        values = working.values_buffer[:, 0, :, start:end].transpose(1, 2)
        self.pool.write_all_layers(slots, keys, values)
