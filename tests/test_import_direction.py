"""Imports point one way: between the programs, and between the rooms (folders and root modules) of a program.

Every `import` and `from ... import` counts, at module level or inside a function, so a lazy import cannot hide a
cycle. A room is a program's first-level subpackage or root module (`gateway.config`, `gateway.recording`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What each program may not import (the neutral `prefixscope` helpers import no program at all).
FORBIDDEN = {
    "local_engine": {"db", "gateway", "dashboard", "prefixscope.cli", "prefixscope.stack"},
    "db": {"gateway", "dashboard", "local_engine", "torch", "transformers", "streamlit", "litestar"},
    "gateway": {"dashboard", "local_engine", "torch", "transformers", "streamlit"},
    "dashboard": {"gateway", "local_engine", "torch", "transformers"},
}
NEUTRAL = ("prefixscope/paths.py", "prefixscope/progress.py", "prefixscope/logs.py", "prefixscope/tracing.py",
           "prefixscope/export_failures.py")
PROGRAMS = {"db", "gateway", "dashboard", "local_engine"}
# Programs whose rooms must not import each other in a circle.
ACYCLIC = ("gateway", "db", "dashboard", "local_engine")
# `gateway.config` sits below every feature: besides itself it may import only these.
# db.retention.prices declares the [advice.cache_prices] section, which the gateway checks at start.
CONFIG_MAY_IMPORT = ("gateway.errors", "db.records", "db.writer_config", "db.retention.costs", "db.retention.prices")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def imported_names(path: Path) -> tuple[tuple[str, int], ...]:
    """Every name `path` imports, with its line: `from a.b import c` gives `a.b` and `a.b.c` (parsed once)."""
    return tuple(_imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))))


def _imports(tree: ast.AST) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno
            yield from ((f"{node.module}.{alias.name}", node.lineno) for alias in node.names)


def modules_of(package: str, root: Path = ROOT) -> dict[str, Path]:
    return {module_name(path, root): path for path in (root / package).rglob("*.py")}


def room_of(module: str) -> str:
    """`gateway.explain.reasons` -> `gateway.explain`; the package itself is its own room."""
    return ".".join(module.split(".")[:2])


def room_edges(package: str, root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(room, imported room) -> the imports that make the edge (`module:line -> module`)."""
    modules = modules_of(package, root)
    edges: dict[tuple[str, str], list[str]] = {}
    for module, path in modules.items():
        for name, line in imported_names(path):
            target = name
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if not target or target == package:
                continue
            source_room, target_room = room_of(module), room_of(target)
            if source_room != target_room and source_room != package:
                edges.setdefault((source_room, target_room), []).append(f"{module}:{line} -> {target}")
    return edges


def cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one room (Tarjan's algorithm), each sorted."""
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def forbidden_imports(package: str, forbidden: set[str], root: Path = ROOT) -> list[str]:
    found = []
    for module, path in modules_of(package, root).items():
        for name, line in imported_names(path):
            if any(name == banned or name.startswith(banned + ".") for banned in forbidden):
                found.append(f"{module}:{line} imports {name}")
    return sorted(set(found))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_program_imports_upward(package: str) -> None:
    assert forbidden_imports(package, FORBIDDEN[package]) == []


def test_the_neutral_helpers_import_no_program() -> None:
    offenders = [
        f"{relative}:{line} imports {name}"
        for relative in NEUTRAL
        for name, line in imported_names(ROOT / relative)
        if name.split(".")[0] in PROGRAMS
    ]
    assert offenders == []


@pytest.mark.parametrize("package", ACYCLIC)
def test_rooms_import_each_other_in_no_cycle(package: str) -> None:
    edges = room_edges(package)
    found = cycles(edges)
    explained = {
        " <-> ".join(cycle): sorted(
            f"{a} -> {b}: {why[0]}" for (a, b), why in edges.items() if a in cycle and b in cycle
        )
        for cycle in found
    }
    assert explained == {}


def test_gateway_config_imports_no_feature() -> None:
    offenders = []
    for module, path in modules_of("gateway").items():
        if room_of(module) != "gateway.config":
            continue
        for name, line in imported_names(path):
            top = name.split(".")[0]
            if top in PROGRAMS and room_of(name) != "gateway.config" and not name.startswith(CONFIG_MAY_IMPORT):
                offenders.append(f"{module}:{line} imports {name}")
    assert offenders == []


def test_the_scan_finds_a_cycle_through_a_lazy_import_and_an_upward_import(tmp_path: Path) -> None:
    """The checks above can fail: a two-room cycle closed inside a function, and db importing the gateway."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "inner.py").write_text("from pkg.top import helper\n")
    (tmp_path / "pkg" / "top.py").write_text("def helper():\n    from pkg.sub.inner import x\n")
    (tmp_path / "pkg" / "leaf.py").write_text("import pkg.top\n")
    assert cycles(room_edges("pkg", tmp_path)) == [["pkg.sub", "pkg.top"]]
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "store.py").write_text("import json\nfrom gateway.config import GatewayConfig\n")
    assert forbidden_imports("db", FORBIDDEN["db"], tmp_path) == [
        "db.store:2 imports gateway.config",
        "db.store:2 imports gateway.config.GatewayConfig",
    ]
