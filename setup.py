"""Builds the optional CPU decode kernels (local_engine/model/csrc); everything else is declared in pyproject.toml.
Without a C compiler the build skips them and the engine runs on torch's kernels alone."""

from pathlib import Path

from setuptools import Extension, setup

SOURCES = sorted(str(path) for path in Path("local_engine/model/csrc").glob("*.c"))

setup(
    ext_modules=[
        Extension(
            "local_engine.model._cpu_kernels",
            SOURCES,
            depends=sorted(str(path) for path in Path("local_engine/model/csrc").glob("*.h")),
            # Only the module's init is exported: the kernels' C names stay inside the extension.
            extra_compile_args=["-O3", "-std=c11", "-fvisibility=hidden"],
            libraries=["dl", "m"],
            optional=True,
        )
    ]
)
