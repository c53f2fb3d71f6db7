"""Linear layers whose weights oneDNN has laid out once, ahead of every step, on the CPU in reduced precision.

For a bfloat16 (or float16) `F.linear` on the CPU, torch calls oneDNN, which first reorders the weight into its
blocked layout on every call: a decode step then reads each weight twice and writes it once. Reordered once at start
(`torch.ops.mkldnn._reorder_linear_weight`, the layout torch.compile's CPU backend packs linear weights into) and
multiplied through `torch.ops.mkldnn._linear_pointwise`, the same oneDNN kernel runs without that pass and gives the
same outputs bit for bit for up to EXACT_ROWS input rows (decode steps, short chunks). On one core of a 2-core AMD EPYC
(AVX512-BF16), 30 bf16 weights of 3072x576 took 10.3 ms against 15.1 ms for one input row, 9.7 against 17.5 for 8 rows,
and 276 against 296 for 512, with no output differing. On a CPU with AMX (a 2-core Xeon), oneDNN picks other kernels for
the packed and the plain weight above 32 rows, which sum in another order: some outputs then differ by one bf16 rounding
step (at most 0.0156 on outputs up to about 4, rows 33-512), while the packed weight stays 15-25% faster (2 threads, 30
weights of 3072x576: 12.7 against 15.8 ms at 33 rows, 39.4 against 45.8 at 512). float32 goes through the CPU kernels
of local_engine.model.cpu_kernels for up to their MAX_ROWS rows where they run, else `F.linear` (MKL's SGEMM, no
reorder per call), as does every other device. A bf16 decode step on those kernels (local_engine.model.fused_llama)
brings float32 rows: up to their `max_rows` go through their bf16 matmul, more through the packed weight,
rounded to bf16 and widened back.

The packed copy is held beside the plain weight, which the model's own modules keep using: the weights' memory is
held twice on the CPU in reduced precision.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from local_engine.model import cpu_kernels

_PACKING_HINT_ROWS = 1  # the batch-size hint of the reorder; the packed weight serves any number of rows
EXACT_ROWS = 32  # up to this many rows, outputs equal F.linear's bit for bit on every CPU measured


def packs(weight: torch.Tensor) -> bool:
    """Whether `weight` is packed by `PackedLinear`: on the CPU, bf16 or fp16, with oneDNN able to compute in it."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if weight.dtype == torch.float16:
        return torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return False


class PackedLinear:
    """`x @ weight.T` (no bias) for `weight` `[out_features, in_features]`: through the CPU kernels for a few float32
    rows where they run, else a packed oneDNN copy where `packs` says so, else `F.linear`. Call with `x`
    `[..., in_features]`; returns `[..., out_features]` in `x`'s dtype where the CPU kernels run on the weight
    (a bf16 weight takes float32 rows), else in `weight`'s."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.packed = (torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACKING_HINT_ROWS)
                       if packs(weight) else None)
        self.native_rows = cpu_kernels.max_rows(weight)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def native(self) -> bool:
        """Whether the CPU kernels serve this weight for a few float32 rows (see `__call__`)."""
        return self.native_rows > 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.native_rows and x.dim() == 2 and x.shape[0] <= self.native_rows and x.dtype == torch.float32:
            return cpu_kernels.linear(x.contiguous(), self.weight)
        if x.dtype != self.weight.dtype and self.native:
            # float32 rows of a decode step on a bf16 weight, more than the kernel takes: oneDNN's bf16 GEMM on
            # the rows rounded to bf16, widened back
            return self(x.to(self.weight.dtype)).float()
        if self.packed is None or not torch._C._get_mkldnn_enabled():
            return F.linear(x, self.weight)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
