"""The `_cpu_kernels` extension behind local_engine.model.cpu_kernels: whether it may run here, why not, and which of
its paths ran.

It runs where it was built from the sources shipped beside it, the CPU has AVX2 and FMA, torch's OpenMP runtime was
found, and nobody switched it off. A build from other sources is refused, not trusted: setup.py compiles
`source_hash()` of local_engine/model/csrc into the module (`SOURCE_HASH`) and `extension()` compares it with the hash
of the files here, so a checkout whose C changed since the last `pip install -e .` runs on torch, with the reason
logged, instead of calling entry points whose arguments may have moved.

The off switch: `PREFIXSCOPE_CPU_KERNELS=off` in the environment, or `set_mode("off")` (the engine's
`--cpu-kernels off`), leaves every step on torch's kernels, as on a machine where the kernels were not built. It is
one setting per process, read when a model's forward is built and at each step; the environment (read at import and
at each `set_mode`) wins over "auto".

Imports nothing outside the standard library until the extension is loaded: setup.py loads this file by path for
`source_hash`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

ENV_VAR = "PREFIXSCOPE_CPU_KERNELS"
MODES = ("auto", "off")  # auto: run where they can; off: torch's kernels only
SOURCE_DIR = Path(__file__).with_name("csrc")
# The paths the extension counts, as its PATH_NAMES lists them (csrc/module.c), and the one counted here: steps on the
# CPU whose forward ran on torch's kernels (local_engine.model.runner).
KERNEL_PATHS = ("amx_chunk_attention", "matmul_512", "matmul_256", "decode_layers", "invariant_matmul",
                "invariant_attention")
TORCH_PATH = "torch"

_mode = "auto"
_torch_steps = 0


def source_hash(directory: Path = SOURCE_DIR) -> str | None:
    """16 hex digits of SHA-256 over the `.c` and `.h` files of `directory` (names and contents, in name order), or
    None when it holds none."""
    files = sorted(path for path in directory.glob("*") if path.suffix in (".c", ".h") and path.is_file())
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        data = path.read_bytes()
        digest.update(f"{path.name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def _environment_reason() -> str | None:
    """Why the environment switches the kernels off, or None."""
    setting = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if setting not in MODES:
        # A value meant to switch them off but misspelt must not leave them on: torch's kernels are always right.
        return f"{ENV_VAR}={setting!r} is neither auto nor off"
    return f"{ENV_VAR}=off" if setting == "off" else None


# Read at import and at each set_mode, not at each call: `available()` is asked several times a layer.
_off_reason = _environment_reason()


def set_mode(mode: str) -> None:
    """Switch the kernels on ("auto": where they can run, unless the environment says off, read again here) or "off"
    for the whole process; steps planned and forwards built from now on follow it. Raises ValueError for another
    mode."""
    global _mode, _off_reason
    if mode not in MODES:
        raise ValueError(f"CPU kernels mode {mode!r}: choose one of {', '.join(MODES)}")
    if mode != _mode:
        log.info("CPU kernels: %s", "switched off (--cpu-kernels off)" if mode == "off" else "auto")
    _mode = mode
    _off_reason = _environment_reason() or ("--cpu-kernels off" if mode == "off" else None)


def off_reason() -> str | None:
    """Why the kernels are switched off (the environment variable, or `set_mode`), or None when they are not."""
    return _off_reason


@functools.cache
def extension() -> tuple[ModuleType | None, str | None]:
    """The loaded extension and None, or None and why it does not run here (logged once). Loads it on first call,
    which must come after torch's import (its OpenMP runtime is bound here)."""
    module, reason = _load()
    if reason is not None:
        stale = module is not None
        log.log(logging.WARNING if stale else logging.INFO, "CPU kernels not used: %s", reason)
        return None, reason
    return module, None


def _load() -> tuple[ModuleType | None, str | None]:
    """(module, None) when it runs; (None, reason), or (module, reason) for a build refused as stale."""
    try:
        from local_engine.model import _cpu_kernels
    except ImportError as error:
        return None, f"not built ({error})"
    built, here = getattr(_cpu_kernels, "SOURCE_HASH", None), source_hash()
    if here is None:
        return _cpu_kernels, f"its sources ({SOURCE_DIR}) are not installed beside it, so the build cannot be checked"
    if built != here:
        return _cpu_kernels, (f"the build is stale: built from sources {built}, the sources here are {here}; rebuild "
                              f"with `pip install --no-deps -e .` or `python setup.py build_ext --inplace`")
    if not _cpu_kernels.supported():
        return None, "this CPU lacks AVX2 and FMA"
    try:  # the OpenMP runtime torch loaded, found among the process's mapped files
        with open("/proc/self/maps") as maps:
            runtimes = {line.split()[-1] for line in maps if "/libgomp" in line or "/libiomp" in line}
    except OSError as error:
        return None, f"cannot find torch's OpenMP runtime ({error})"
    # torch's own copy first, should another package have loaded the system's libgomp beside it
    if not any(_cpu_kernels.bind_openmp(path) for path in sorted(runtimes, key=lambda path: "/torch/" not in path)):
        return None, "torch's OpenMP runtime was not found among the process's libraries"
    return _cpu_kernels, None


def count_torch_step() -> None:
    """Count a step on the CPU whose forward ran on torch's kernels (the `torch` path)."""
    global _torch_steps
    _torch_steps += 1


def path_counts() -> dict[str, int]:
    """How many times each path ran in this process: the extension's KERNEL_PATHS (`amx_chunk_attention`: chunk
    attention calls, one per layer and chunk; `matmul_512`, `matmul_256`: matmuls on the 512-bit bf16 path and on the
    256-bit one; `decode_layers`: decode steps run through every layer in one call; `invariant_matmul`,
    `invariant_attention`: calls of the batch-invariant kernels (local_engine.model.invariant_kernels); zeros where
    it does not run) and
    `torch`: steps on the CPU whose forward ran on torch's kernels. The difference between two readings is what ran
    in between."""
    module, _ = extension()
    counts = dict.fromkeys(KERNEL_PATHS, 0) if module is None else dict(zip(module.PATH_NAMES, module.path_counts()))
    counts[TORCH_PATH] = _torch_steps
    return counts


def paths_since(before: dict[str, int]) -> dict[str, int]:
    """The paths that ran since `before` (a `path_counts()` reading) and how many times, leaving out those that did
    not run: what served the steps in between."""
    after = path_counts()
    return {path: after[path] - before.get(path, 0) for path in after if after[path] != before.get(path, 0)}
