"""The engine's layout rules: local_engine imports no other program, and its folders import each other one way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "local_engine"
OTHER_PROGRAMS = {"gateway", "db", "dashboard"}


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at module level or inside a function (absolute names)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def room_of(module: str) -> str | None:
    """The folder (api, engine, cache, ...) or root module (cli, config, ...) of a local_engine module."""
    parts = module.split(".")
    if parts[0] != "local_engine" or len(parts) < 2:
        return None
    return parts[1]


def modules() -> dict[str, Path]:
    return {".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts): path for path in PACKAGE.rglob("*.py")}


def room_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    known = {room_of(name) for name in modules()}
    for name, path in modules().items():
        room = room_of(name)
        for imported in imported_modules(path):
            target = room_of(imported)
            if target in known and target != room:
                graph.setdefault(room, set()).add(target)
    return graph


def test_the_engine_imports_no_other_program():
    offenders = [
        f"{name} imports {imported}"
        for name, path in modules().items()
        for imported in imported_modules(path)
        if imported.split(".")[0] in OTHER_PROGRAMS
    ]
    assert offenders == []


def test_the_engine_folders_import_each_other_without_cycles():
    graph = room_graph()
    assert {"api", "engine", "model", "prompt", "bench", "cli"} <= set(graph)
    cycles = []

    def visit(room: str, path: list[str]) -> None:
        for target in sorted(graph.get(room, ())):
            if target in path:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            else:
                visit(target, path + [target])

    for start in sorted(graph):
        visit(start, [start])
    assert cycles == []


@pytest.mark.parametrize(("lower", "upper"), [("cache", "engine"), ("cache", "model"), ("model", "engine"),
                                              ("prompt", "engine"), ("engine", "api"), ("cache", "api")])
def test_lower_folders_never_import_upper_ones(lower, upper):
    assert upper not in room_graph().get(lower, set())
