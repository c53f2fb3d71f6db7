"""Builds the optional CPU decode kernels (local_engine/model/csrc); everything else is declared in pyproject.toml.
Without a C compiler the build skips them and the engine runs on torch's kernels alone."""

import importlib.util
from pathlib import Path

from setuptools import Extension, setup

SOURCE_DIR = Path("local_engine/model/csrc")
SOURCES = sorted(str(path) for path in SOURCE_DIR.glob("*.c"))


def _source_hash() -> str:
    """The hash of the sources compiled in as SOURCE_HASH, from the function the engine checks it with (loaded by
    path: the package itself needs torch)."""
    spec = importlib.util.spec_from_file_location("kernel_extension", "local_engine/model/kernel_extension.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.source_hash(SOURCE_DIR)


setup(
    ext_modules=[
        Extension(
            "local_engine.model._cpu_kernels",
            SOURCES,
            depends=sorted(str(path) for path in SOURCE_DIR.glob("*.h")),
            define_macros=[("PREFIXSCOPE_KERNELS_SOURCE_HASH", f'"{_source_hash()}"')],
            # Only the module's init is exported: the kernels' C names stay inside the extension.
            extra_compile_args=["-O3", "-std=c11", "-fvisibility=hidden"],
            libraries=["dl", "m"],
            optional=True,
        )
    ]
)
