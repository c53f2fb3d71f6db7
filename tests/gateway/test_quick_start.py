"""The README's quick start, run as a newcomer types it: each command in a fresh shell (no venv activated, nothing on
PATH but the system's), from the clone, against a gateway that started before the key existed.

`make up` itself is checked as `make -n up` (the engine's model load is what other tests pay for); the gateway under
it is the real one in front of the stub engine, on the same database the commands use."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gateway_testkit import db_storage, gateway_config, running_gateway

ROOT = Path(__file__).resolve().parents[2]
QUICK_START_PORT = "http://127.0.0.1:8080"


def quick_start_blocks() -> list[str]:
    """The ```sh blocks of the README's "Quick start" section, in order."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)


def fresh_shell(script: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "PREFIXSCOPE_HOME": str(home / "state"),
           "LANG": "C.UTF-8"}
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-e", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )


def test_the_readme_quick_start_works_as_typed(stub, stub_url, tmp_path) -> None:
    blocks = quick_start_blocks()
    assert [block.split()[0:2] for block in blocks[:3]] == [
        ["make", "up"], [".venv/bin/prefixscope", "keys"], ["export", "PREFIXSCOPE_KEY=psk-..."]
    ]
    make_up, create_key, first_request, *later = blocks

    dry_run = subprocess.run(["make", "-n", *make_up.split()[1:]], cwd=ROOT, capture_output=True, text=True,
                             check=True, env={"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert dry_run.stdout.strip().splitlines()[-1].startswith(".venv/bin/prefixscope up")

    database = tmp_path / "state" / "prefixscope.db"
    config = gateway_config(stub_url, auth="keys", key_refresh_interval_s=60.0)
    with running_gateway(config, db_storage(f"sqlite:///{database}", tmp_path)) as gw:
        created = fresh_shell(create_key, tmp_path)
        assert created.returncode == 0, created.stderr
        key = re.search(r"psk-\S+", created.stdout).group(0)
        script = first_request.replace("psk-...", key).replace(QUICK_START_PORT, gw.url)
        answered = fresh_shell(script, tmp_path)
        assert answered.returncode == 0, answered.stderr
        assert answered.stdout.splitlines() == ["10 prompt tokens, 4 from cache"] * 2  # what the stub engine said
    assert len(stub.state.requests) == 2  # the new key was let in at once: nothing was refused or retried

    stats, advise = later[0], later[1]
    shown = fresh_shell(stats, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"\bacme\s+2\b", shown.stdout), shown.stdout
    assert "requests by retention class:" in shown.stdout
    advised = fresh_shell(advise, tmp_path)
    assert advised.returncode == 0, advised.stderr
    # The test gateway samples no request for advice; the answer must then say how advice comes to be.
    assert "acme" in advised.stdout or "advice_sample_rate" in advised.stdout, advised.stdout
