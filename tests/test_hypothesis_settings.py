"""No timing assertions in tests: every Hypothesis test runs with `deadline=None` (its default, 200 ms per example,
fails a test on a slow or busy machine), stated in a `settings` next to its `@given`, so it stays true."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        return _name(node.func)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _no_deadline(call: ast.Call, good: set[str]) -> bool:
    """A `settings(...)` call that sets deadline=None, or derives from a settings object that does."""
    for keyword in call.keywords:
        if keyword.arg == "deadline":
            return isinstance(keyword.value, ast.Constant) and keyword.value.value is None
    return bool(call.args) and isinstance(call.args[0], ast.Name) and call.args[0].id in good


def problems_in(path: Path, root: Path = TESTS) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    good: set[str] = set()
    for node in tree.body:  # module-level settings objects: FUZZ = settings(..., deadline=None)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _name(node.value) == "settings":
            if _no_deadline(node.value, good):
                good.update(target.id for target in node.targets if isinstance(target, ast.Name))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node) == "settings" and not _no_deadline(node, good):
            found.append(f"{path.relative_to(root)}:{node.lineno}: settings(...) without deadline=None")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [_name(d) for d in node.decorator_list]
            if "given" not in names:
                continue
            ok = any(
                (isinstance(d, ast.Call) and _name(d) == "settings" and _no_deadline(d, good))
                or (isinstance(d, ast.Name) and d.id in good)
                for d in node.decorator_list
            )
            if not ok:
                found.append(f"{path.relative_to(root)}:{node.lineno}: @given without settings(deadline=None)")
    return found


def test_every_hypothesis_test_has_no_deadline() -> None:
    problems = [problem for path in sorted(TESTS.rglob("*.py")) for problem in problems_in(path)]
    assert not problems, "\n".join(problems)


def test_the_scan_finds_what_it_must(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "from hypothesis import given, settings\n"
        "OK = settings(deadline=None)\n"
        "@given(1)\ndef test_a(x): pass\n"
        "@settings(max_examples=5)\n@given(1)\ndef test_b(x): pass\n"
        "@OK\n@given(1)\ndef test_c(x): pass\n"
        "@settings(OK, max_examples=5)\n@given(1)\ndef test_d(x): pass\n"
    )
    found = problems_in(sample, tmp_path)
    assert len(found) == 3, found  # test_a, and test_b's settings call and its @given
    assert any("test_sample.py:4:" in f and "@given" in f for f in found)  # test_a: no settings
    assert any("test_sample.py:5:" in f for f in found)  # settings without deadline=None
    assert any("test_sample.py:7:" in f and "@given" in f for f in found)  # test_b
    assert not any(":10:" in f or ":13:" in f for f in found)  # test_c and test_d are fine
