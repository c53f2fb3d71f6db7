"""The engine's folders are layers: a lower one never imports an upper one, lazily or not.

`tests/test_import_direction.py` checks that local_engine imports no other program and that its rooms import each
other in no cycle; this adds the direction: `cli → bench → api → engine → prompt, model → cache`."""

from __future__ import annotations

import pytest

from tests.test_import_direction import room_edges

# Each folder with the folders above it (which it must not import).
UPPER = {
    "local_engine.cache": {"local_engine.model", "local_engine.prompt", "local_engine.engine", "local_engine.api",
                           "local_engine.bench", "local_engine.cli"},
    "local_engine.model": {"local_engine.prompt", "local_engine.engine", "local_engine.api", "local_engine.bench",
                           "local_engine.cli"},
    "local_engine.prompt": {"local_engine.model", "local_engine.engine", "local_engine.api", "local_engine.bench",
                            "local_engine.cli"},
    "local_engine.engine": {"local_engine.api", "local_engine.bench", "local_engine.cli"},
    "local_engine.api": {"local_engine.bench", "local_engine.cli"},
    "local_engine.bench": {"local_engine.cli"},
}
# Below every folder: settings with their flags and the exception hierarchy.
BASE = {"local_engine.config", "local_engine.options", "local_engine.errors"}


@pytest.mark.parametrize("lower", sorted(UPPER))
def test_lower_folders_never_import_upper_ones(lower: str):
    edges = room_edges("local_engine")
    upward = sorted(why for (source, target), why in edges.items() if source == lower and target in UPPER[lower])
    assert upward == []


def test_the_base_modules_import_no_folder():
    edges = room_edges("local_engine")
    assert sorted(why for (source, target), why in edges.items() if source in BASE and target not in BASE) == []
