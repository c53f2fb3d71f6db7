"""The tier flags of `prefixscope engine`: parsed into EngineConfig, bad combinations refused by argparse."""

from __future__ import annotations

import argparse

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


def test_a_second_engine_on_a_locked_directory_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    import fcntl
    import os

    import local_engine.model_loader
    from local_engine.cache.disk_index import LOCK_FILE
    from prefixscope.cli import main

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the directory's lock was checked")

    monkeypatch.setattr(local_engine.model_loader, "load_model", never)
    held = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)  # the lock a first engine holds
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert main(["engine", "--disk-cache-dir", str(tmp_path), "--port", "0"]) == 2
    finally:
        os.close(held)
    error = capsys.readouterr().err
    assert f"the disk cache directory {tmp_path} is in use by another engine" in error
    assert "Traceback" not in error
    # Once the first engine is gone the check passes (and the engine would go on to load its model).
    with pytest.raises(AssertionError, match="the model was loaded"):
        main(["engine", "--disk-cache-dir", str(tmp_path), "--port", "0"])
