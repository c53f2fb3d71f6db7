"""`db` stands alone: no web framework, no engine, no other program; its CLI module is cheap to import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("litestar", "streamlit", "torch", "transformers", "gateway", "dashboard", "local_engine", "httpx")


def _loaded_after(code: str) -> set[str]:
    script = f"import sys\n{code}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in out.stdout.split()}


def test_db_imports_no_other_program_or_framework() -> None:
    modules = sorted(
        "db." + ".".join(path.relative_to(ROOT / "db").with_suffix("").parts)
        for path in (ROOT / "db").rglob("*.py")
        if path.name != "__init__.py"
    )
    loaded = _loaded_after("\n".join(f"import {name}" for name in modules))
    assert not loaded & set(FORBIDDEN)


def test_cli_module_is_cheap_to_import() -> None:
    loaded = _loaded_after("import db.cli")
    assert "sqlalchemy" not in loaded and "alembic" not in loaded
