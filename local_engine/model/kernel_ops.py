"""The CPU kernels as declared torch operators: `kernel_op` turns a function that checks a call's tensors into the op
`prefixscope::<name>`, whose schema torch checks (argument types, which tensors the op writes), whose checks run
before the kernel touches memory, and which torch's profiler shows by name.

A declared function takes only what a schema holds (tensors, ints, floats, bools, optional tensors), checks shapes,
dtypes, strides and devices, raising ValueError with what it got, and returns the launch: a function of the loaded
extension that calls the kernel on the checked tensors' addresses. On CPU tensors the op runs both; on fake tensors
(torch.compile's tracing, `torch._subclasses.FakeTensorMode`) only the checks. An op writes into tensors its caller
allocated and returns nothing, so no fake output needs declaring. Checks that depend on values (a slot outside the
pool) stay in the C kernels, which raise IndexError before writing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType

import torch

from local_engine.model import kernel_extension

NAMESPACE = "prefixscope"
Launch = Callable[[ModuleType], object]
STORED_DTYPES = (torch.float32, torch.bfloat16)  # how weights and the pool may be stored

_LIBRARY = torch.library.Library(NAMESPACE, "DEF")


def kernel_op(*, mutates: tuple[str, ...] = ()) -> Callable[[Callable[..., Launch]], torch._ops.OpOverload]:
    """Declare the decorated checks (named as the op; annotated with schema types) as `prefixscope::<name>`, writing
    the arguments named in `mutates`; returns the op, called as the function was. Calling it where the kernels are
    not loaded raises RuntimeError with the reason."""

    def declare(checks: Callable[..., Launch]) -> torch._ops.OpOverload:
        name = checks.__name__.lstrip("_")
        signature = inspect.signature(checks, eval_str=True)

        def prototype(*args, **kwargs) -> None:
            raise NotImplementedError

        prototype.__signature__ = signature.replace(return_annotation=None)  # the schema's return: nothing
        _LIBRARY.define(name + torch.library.infer_schema(prototype, mutates_args=mutates))

        def run(*args) -> None:
            launch = checks(*args)
            module, reason = kernel_extension.extension()
            if module is None:
                raise RuntimeError(f"{NAMESPACE}::{name}: the CPU kernels do not run here: {reason}")
            launch(module)

        def fake(*args) -> None:
            checks(*args)

        _LIBRARY.impl(name, run, "CPU")
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)
        return getattr(getattr(torch.ops, NAMESPACE), name).default

    return declare


def expect(condition: bool, message: Callable[[], str]) -> None:
    """Raise ValueError(message()) unless `condition`; the message is built only then."""
    if not condition:
        raise ValueError(message())


def float_rows(x: torch.Tensor, name: str, columns: int | None = None) -> None:
    """Checks that `x` is a contiguous float32 CPU matrix (of `columns` columns, when given)."""
    expect(x.dim() == 2 and x.dtype == torch.float32 and x.is_cpu and x.is_contiguous()
           and (columns is None or x.shape[1] == columns),
           lambda: f"{name}: a contiguous float32 CPU matrix{'' if columns is None else f' of {columns} columns'}, "
           f"got {describe(x)}")


def stored(x: torch.Tensor, name: str, dim: int) -> None:
    """Checks that `x` is a contiguous float32 or bfloat16 CPU tensor of `dim` dimensions (a weight, a pool)."""
    expect(x.dim() == dim and x.dtype in STORED_DTYPES and x.is_cpu and x.is_contiguous(),
           lambda: f"{name}: a contiguous float32 or bfloat16 CPU tensor of {dim} dimensions, got {describe(x)}")


def int64s(x: torch.Tensor, name: str, dim: int) -> None:
    """Checks that `x` is a contiguous int64 CPU tensor of `dim` dimensions (slots, a plan, a table)."""
    expect(x.dim() == dim and x.dtype == torch.int64 and x.is_cpu and x.is_contiguous(),
           lambda: f"{name}: a contiguous int64 CPU tensor of {dim} dimensions, got {describe(x)}")


def describe(x: torch.Tensor) -> str:
    """`x`'s shape, dtype, device and strides, for error messages."""
    return f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')} on {x.device.type}, strides {x.stride()}"
