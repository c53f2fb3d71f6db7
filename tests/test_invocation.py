"""Messages tell a user to run `prefixscope ...` as it can be typed where they are: after `make up` the command is
`.venv/bin/prefixscope` (not on PATH) until the venv is activated."""

from __future__ import annotations

import sys
from pathlib import Path

from prefixscope.invocation import typed_command

BIN = Path(sys.executable).parent  # the running installation's scripts (the clone's .venv/bin under `make`)


def test_the_command_is_named_as_it_can_be_typed(tmp_path: Path) -> None:
    assert (BIN / "prefixscope").exists()
    clone = BIN.parent.parent  # .venv/bin -> the clone
    not_on_path = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    assert typed_command(clone, not_on_path) == str((BIN / "prefixscope").relative_to(clone))
    assert typed_command(tmp_path, not_on_path) == str(BIN / "prefixscope")  # elsewhere: the whole path
    assert typed_command(clone, {"PATH": f"{BIN}:/usr/bin"}) == "prefixscope"  # an activated venv


def test_up_tells_the_user_the_command_that_works(monkeypatch, tmp_path: Path) -> None:
    import prefixscope.stack as stack

    told = {}
    monkeypatch.setattr(stack, "supervise", lambda programs, timeout, ready_message: told.setdefault("ready",
                                                                                                     ready_message))
    monkeypatch.setattr(stack, "port_problems", lambda host, requests: [])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("PREFIXSCOPE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(BIN.parent.parent)
    from prefixscope.cli import build_parser

    args = build_parser().parse_args(["up"])
    args.handler(args)
    assert f"{typed_command()} keys create --tenant NAME" in told["ready"]
    assert typed_command() != "prefixscope"  # not on PATH here: the message names the path
