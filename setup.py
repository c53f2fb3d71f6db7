"""Builds the optional float32 CPU decode kernels (local_engine/model/cpu_kernels.c); everything else is declared in
pyproject.toml. Without a C compiler the build skips them and the engine runs on torch's kernels alone."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "local_engine.model._cpu_kernels",
            ["local_engine/model/cpu_kernels.c"],
            extra_compile_args=["-O3", "-std=c11"],
            libraries=["dl", "m"],
            optional=True,
        )
    ]
)
