"""No module of a program grows past MAX_LINES: a file that long does more than one job and is split.

A file may stay longer only when listed in EXCEPTIONS with the reason."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("local_engine", "gateway", "db", "dashboard", "prefixscope", "migrations")
MAX_LINES = 400
# "path relative to the repository root": "why it stays one file"
EXCEPTIONS: dict[str, str] = {}


def test_no_module_is_longer_than_the_limit():
    too_long = {}
    for program in PROGRAMS:
        for path in sorted((ROOT / program).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            num_lines = len(path.read_text().splitlines())
            if num_lines > MAX_LINES and name not in EXCEPTIONS:
                too_long[name] = num_lines
    assert too_long == {}, f"split these modules (or list them in EXCEPTIONS with a reason): {too_long}"


def test_every_exception_is_still_needed_and_says_why():
    for name, reason in EXCEPTIONS.items():
        path = ROOT / name
        assert path.is_file(), f"{name} is listed but gone"
        assert len(path.read_text().splitlines()) > MAX_LINES, f"{name} is within the limit now: unlist it"
        assert reason.strip(), f"{name} is listed without a reason"
