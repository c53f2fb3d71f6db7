"""The tier flags of `prefixscope engine`: parsed into EngineConfig, bad combinations refused by argparse."""

from __future__ import annotations

import argparse
import os

import pytest

from local_engine.cli import check_engine_options, engine_config_from, register
from local_engine.config import EngineConfig


def parse(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="prefixscope")
    commands = parser.add_subparsers(dest="command")
    bench = commands.add_parser("bench").add_subparsers(dest="bench_command")
    register(commands, bench)
    args = parser.parse_args(["engine", *argv])
    check_engine_options(args.engine_parser, args)
    return parser, args


def test_tier_flags_reach_the_engine_config(tmp_path):
    _, args = parse(["--host-cache-gib", "0.5", "--disk-cache-dir", str(tmp_path), "--cache-write-policy",
                     "write_through"])
    config = engine_config_from(args)
    assert config.host_cache_gib == 0.5 and config.host_cache_tokens is None and config.host_enabled
    assert config.disk_cache_dir == str(tmp_path) and config.disk_capacity_gib == 10.0
    assert config.cache_write_policy == "write_through"
    _, args = parse(["--host-cache-tokens", "0", "--disk-cache-dir", str(tmp_path), "--disk-cache-gib", "2"])
    config = engine_config_from(args)
    assert not config.host_enabled and config.disk_capacity_gib == 2.0


def test_tiers_are_off_by_default():
    _, args = parse([])
    config = engine_config_from(args)
    assert not config.host_enabled and config.disk_cache_dir is None and config.cache_write_policy == "write_back"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--host-cache-tokens", "100", "--host-cache-gib", "1"], "not allowed with argument"),
        (["--host-cache-tokens", "-5"], "negative"),
        (["--host-cache-gib", "lots"], "not a number"),
        (["--disk-cache-gib", "0", "--disk-cache-dir", "/tmp/x"], "must be positive"),
        (["--disk-cache-gib", "3"], "--disk-cache-gib needs --disk-cache-dir"),
        (["--cache-write-policy", "sometimes"], "invalid choice"),
        (["--no-prefix-cache", "--host-cache-tokens", "64"], "need the prefix cache"),
    ],
)
def test_bad_tier_options_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_engine_config_refuses_both_host_sizes():
    with pytest.raises(ValueError, match="tokens or in GiB"):
        EngineConfig(host_cache_tokens=10, host_cache_gib=1.0)
    with pytest.raises(ValueError, match="needs --disk-cache-dir"):
        EngineConfig(disk_cache_gib=1.0)


def test_prefixscope_up_passes_the_tier_flags_to_the_engine(tmp_path):
    from prefixscope.stack import _engine_options

    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    from prefixscope.stack import register as register_up

    register_up(commands, None)
    args = parser.parse_args(["up", "--host-cache-tokens", "4096", "--disk-cache-dir", str(tmp_path),
                              "--disk-cache-gib", "1.5", "--cache-write-policy", "write_through"])
    argv = _engine_options(args)
    _, engine_args = parse(argv)
    config = engine_config_from(engine_args)
    assert (config.host_cache_tokens, config.disk_cache_dir, config.disk_cache_gib, config.cache_write_policy) == (
        4096, str(tmp_path), 1.5, "write_through")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--disk-cache-gib", "3"], "--disk-cache-gib needs --disk-cache-dir"),
        (["--no-prefix-cache", "--host-cache-tokens", "64"], "need the prefix cache"),
    ],
)
def test_prefixscope_up_refuses_bad_tier_options_before_anything_starts(argv, message, capsys):
    # Otherwise the engine it starts refuses them, and `up` only says the engine did not become healthy.
    from prefixscope.cli import build_parser

    args = build_parser().parse_args(["up", *argv])
    with pytest.raises(SystemExit) as exit_info:
        args.handler(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "prefixscope up: error:" in err


@pytest.fixture
def no_model_load(monkeypatch):
    import local_engine.model.loader

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(local_engine.model.loader, "load_model", never)


def test_a_second_engine_on_a_locked_directory_is_refused_before_the_model_loads(tmp_path, no_model_load, capsys):
    """The first engine holds the directory from before its own model loads, so a second one started meanwhile is
    refused at once."""
    from local_engine.cache.tiers import disk_index
    from prefixscope.cli import main

    first = tmp_path / "kv"
    argv = ["engine", "--disk-cache-dir", str(first), "--port", "0"]
    with pytest.raises(AssertionError, match="the model was loaded"):
        main(argv)  # the first engine: the directory is created and locked, then its model would load
    assert oct((first).stat().st_mode & 0o777) == "0o700"
    reserved = disk_index._RESERVED.pop(str(first.resolve()))  # held as if by another process from here on
    try:
        assert main(argv) == 2
        # DiskTier.open in a process that reserved nothing meets the lock too.
        tier = disk_index.DiskTier(str(first), None, 1 << 20)
        with pytest.raises(disk_index.DiskCacheLocked):
            tier.open()
    finally:
        os.close(reserved)
    error = capsys.readouterr().err
    assert f"the disk cache directory {first} is in use by another engine" in error
    assert "Traceback" not in error


def test_the_engine_adopts_the_lock_it_reserved(tmp_path):
    from local_engine.cache.tiers import disk_index

    disk_index.reserve_directory(str(tmp_path))
    tier = disk_index.DiskTier(str(tmp_path), None, 1 << 20)
    tier.open()  # adopts this process's reservation instead of meeting it as a lock held by someone else
    assert str(tmp_path.resolve()) not in disk_index._RESERVED
    tier.close()
    again = disk_index.DiskTier(str(tmp_path), None, 1 << 20)
    again.open()  # released by close
    again.close()


@pytest.mark.parametrize("kind", ["a regular file", "under a regular file"])
def test_an_unusable_directory_is_refused_before_the_model_loads(tmp_path, no_model_load, capsys, kind):
    from prefixscope.cli import main

    afile = tmp_path / "afile"
    afile.write_text("x")
    directory = afile if kind == "a regular file" else afile / "kv"
    assert main(["engine", "--disk-cache-dir", str(directory), "--port", "0"]) == 2
    error = capsys.readouterr().err
    assert f"cannot use --disk-cache-dir {directory}" in error and "Traceback" not in error
