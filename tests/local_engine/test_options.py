"""Engine options are declared once, on EngineConfig's fields: the flags of `prefixscope engine`, what `prefixscope up`
passes on, and the config the engine builds all follow from that one declaration."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from local_engine.cli import engine_config_from, register
from local_engine.config import EngineConfig, ServerConfig
from local_engine.kv_events.config import KvEventsConfig
from local_engine.options import flags_of, passed_on_argv

# A value other than the default for every passed-on option (one of each mutually exclusive pair).
NON_DEFAULT = {
    "model": "/models/tiny",
    "device": "cpu",
    "kv_cache_gib": 0.5,
    "page_size": 16,
    "eviction": "lfu",
    "ttl_s": 600.0,
    "max_num_seqs": 4,
    "max_num_batched_tokens": 256,
    "attention_backend": "torch",
    "host_cache_tokens": 4096,
    "disk_cache_dir": "/var/cache/prefixscope",
    "disk_cache_gib": 1.5,
    "cache_write_policy": "write_through",
    "cpu_kernels": "off",
}
# The nested KV-event options (`--kv-events-*`, dest `kv_events_<field>`).
NON_DEFAULT_KV_EVENTS = {"endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558",
                         "topic": "kv", "block_size": 32}


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(prog="prefixscope")
    subparsers = parser.add_subparsers(dest="command")
    bench = subparsers.add_parser("bench").add_subparsers()
    register(subparsers, bench)
    from prefixscope.stack import register as register_up

    register_up(subparsers, None)
    return {"engine": subparsers.choices["engine"], "up": subparsers.choices["up"],
            "bench engine": bench.choices["engine"]}


def test_every_passed_on_option_reaches_the_engine_through_up():
    parsers = commands()
    argv = [part for name, value in NON_DEFAULT.items() for part in (_flag(name), str(value))]
    argv += [part for name, value in NON_DEFAULT_KV_EVENTS.items() for part in (_flag("kv_events_" + name), str(value))]
    up_args = parsers["up"].parse_args(argv)
    forwarded = passed_on_argv(EngineConfig, up_args)
    engine_args = parsers["engine"].parse_args(forwarded)
    kv_events = KvEventsConfig(**NON_DEFAULT_KV_EVENTS)
    assert engine_config_from(engine_args) == dataclasses.replace(EngineConfig(), **NON_DEFAULT, kv_events=kv_events)
    # The switch: --no-prefix-cache (the tiers need the cache, so alone).
    forwarded = passed_on_argv(EngineConfig, parsers["up"].parse_args(["--no-prefix-cache"]))
    assert forwarded == ["--no-prefix-cache"]
    assert engine_config_from(parsers["engine"].parse_args(forwarded)).prefix_cache is False
    forwarded = passed_on_argv(EngineConfig, parsers["up"].parse_args(["--enforce-eager"]))
    assert forwarded == ["--enforce-eager"]
    assert engine_config_from(parsers["engine"].parse_args(forwarded)).enforce_eager is True


def test_defaults_are_the_declared_ones_everywhere():
    parsers = commands()
    for command in ("engine", "up", "bench engine"):
        args = parsers[command].parse_args([])
        assert passed_on_argv(EngineConfig, args) == [], command
        for declared in flags_of(EngineConfig):
            if declared.flag.passed_on or command == "engine":
                given = not getattr(args, declared.dest) if declared.negated else getattr(args, declared.dest)
                assert given == declared.default, (command, declared.dest)
    engine_args = parsers["engine"].parse_args([])
    assert engine_config_from(engine_args) == EngineConfig()
    assert (engine_args.host, engine_args.port, engine_args.admin_token, engine_args.api_key) == (
        ServerConfig.host, ServerConfig.port, None, None)


def test_only_the_engine_takes_its_own_options():
    parsers = commands()
    assert parsers["engine"].parse_args(["--shutdown-grace-s", "3"]).shutdown_grace_s == 3.0
    for command in ("up", "bench engine"):
        with pytest.raises(SystemExit):
            parsers[command].parse_args(["--shutdown-grace-s", "3"])


def _flag(dest: str) -> str:
    return next(declared.flag.names[0] for declared in flags_of(EngineConfig) if declared.dest == dest)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--turns-per-prefix", "1"], "--turns-per-prefix: 1 is below 2"),  # no request would hit
        (["--num-prefixes", "0"], "--num-prefixes: 0 is below 1"),
        (["--prefix-tokens", "many"], "'many' is not a whole number"),
        (["--concurrency", "1,0"], "--concurrency: 0 is below 1"),
        (["--bench-max-tokens", "-4"], "--bench-max-tokens: -4 is below 1"),
        (["--api-rounds", "-1"], "--api-rounds: -1 is below 0"),
    ],
)
def test_bench_engine_refuses_sizes_it_cannot_measure_before_loading_anything(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        commands()["bench engine"].parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_bench_engine_takes_an_empty_concurrency_list_as_no_concurrent_runs():
    assert commands()["bench engine"].parse_args(["--concurrency", ""]).concurrency == []
