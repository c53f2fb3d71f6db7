"""Suite-wide set-up: the tests never read or write the user's real prefixscope state directory."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_HOME_KEY = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    # Programs started by the tests inherit it; tests about the default location set their own.
    home = tempfile.mkdtemp(prefix="prefixscope-test-home-")
    config.stash[_HOME_KEY] = home
    os.environ["PREFIXSCOPE_HOME"] = home


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_HOME_KEY, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)
