"""`prefixscope up --replicas N`: N engines on consecutive ports, each with its own pool, behind one gateway."""

from __future__ import annotations

from prefixscope.cli import build_parser
from prefixscope.ports import PortRequest
from prefixscope.stack import _port_requests, plan


def test_up_with_replicas_starts_one_engine_per_replica_behind_the_gateway():
    args = build_parser().parse_args(["up", "--replicas", "3", "--engine-port", "9101", "--kv-cache-tokens", "4096"])
    programs = {p.name: p.argv for p in plan(args)}
    engines = [name for name in programs if name.startswith("engine")]
    assert engines == ["engine1", "engine2", "engine3"]
    for number, name in enumerate(engines):
        argv = programs[name]
        assert argv[argv.index("--port") + 1] == str(9101 + number)
        assert argv[argv.index("--kv-cache-tokens") + 1] == "4096"
        # each publishes its KV events on loopback ports it picks; the gateway reads them from its /v1/cache
        assert argv[argv.index("--kv-events-endpoint") + 1] == "tcp://127.0.0.1:*"
        assert argv[argv.index("--kv-events-replay-endpoint") + 1] == "tcp://127.0.0.1:*"
    gateway = programs["gateway"]
    upstreams = [gateway[i + 1] for i, value in enumerate(gateway) if value == "--upstream"]
    assert upstreams == ["http://127.0.0.1:9101", "http://127.0.0.1:9102", "http://127.0.0.1:9103"]


def test_up_without_replicas_is_one_engine():
    args = build_parser().parse_args(["up"])
    names = [p.name for p in plan(args)]
    assert names[0] == "engine" and "engine2" not in names


def test_every_replica_port_is_checked_before_start():
    args = build_parser().parse_args(["up", "--replicas", "2", "--engine-port", "9101"])
    requests = _port_requests(args, plan(args))
    assert PortRequest("engine1", 9101, "--engine-port") in requests
    assert PortRequest("engine2", 9102, "--engine-port") in requests


def test_a_replica_count_below_one_is_refused(capsys):
    import pytest

    for count in ("0", "-2", "two"):
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args(["up", "--replicas", count])
        assert exit_info.value.code == 2
        assert "--replicas" in capsys.readouterr().err


def test_replica_ports_past_65535_are_refused():
    from prefixscope.ports import port_problems

    args = build_parser().parse_args(["up", "--replicas", "3", "--engine-port", "65534"])
    problems = port_problems("127.0.0.1", _port_requests(args, plan(args)))
    assert any("65536" in problem and "engine3" in problem and "--engine-port" in problem for problem in problems)


def test_up_sends_the_engines_spans_where_the_gateway_config_sends_its_own(tmp_path, monkeypatch):
    from prefixscope.stack import prepare

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    config = tmp_path / "prefixscope.toml"
    config.write_text('[telemetry]\notlp_endpoint = "http://127.0.0.1:4318"\n')
    args = build_parser().parse_args(["up", "--config", str(config), "--replicas", "2"])
    assert prepare(args) == 0
    for name, argv in ((p.name, p.argv) for p in plan(args)):
        if name.startswith("engine"):
            assert argv[argv.index("--otlp-endpoint") + 1] == "http://127.0.0.1:4318"
    # The standard variables win: the engines read them themselves.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318")
    args = build_parser().parse_args(["up", "--config", str(config)])
    assert prepare(args) == 0
    assert all("--otlp-endpoint" not in p.argv for p in plan(args))
