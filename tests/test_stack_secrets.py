"""`prefixscope up` wiring without starting anything: a generated engine secret shared with the gateway and the
dashboard, and open mode only when asked for."""

from __future__ import annotations

import argparse

from prefixscope.stack import plan, shared_secrets_env


def _args(**changes) -> argparse.Namespace:
    values = dict(model="smollm2", device="cpu", kv_cache_tokens=None, host="127.0.0.1", engine_port=8001,
                  gateway_port=8080, dashboard_port=8501, database_url=None, start_timeout=1.0, open=False,
                  config=None, replicas=1)
    values.update(changes)
    return argparse.Namespace(**values)


SECRETS = {
    "PREFIXSCOPE_ENGINE_API_KEY", "PREFIXSCOPE_ENGINE_ADMIN_TOKEN", "PREFIXSCOPE_UPSTREAM_API_KEY",
    "PREFIXSCOPE_DASHBOARD_ENGINE_TOKEN",
}  # fmt: skip


def test_each_program_gets_only_the_secrets_it_needs():
    """The engine gets its API key and admin token; the gateway only the API key (its upstream key); the dashboard
    only the admin token (the cache views)."""
    envs = shared_secrets_env({"PATH": "/bin"})
    engine, gateway, dashboard = envs["engine"], envs["gateway"], envs["dashboard"]
    assert {name: set(env) for name, env in envs.items()} == {
        "engine": {"PATH", "PREFIXSCOPE_ENGINE_API_KEY", "PREFIXSCOPE_ENGINE_ADMIN_TOKEN"},
        "gateway": {"PATH", "PREFIXSCOPE_UPSTREAM_API_KEY"},
        "dashboard": {"PATH", "PREFIXSCOPE_DASHBOARD_ENGINE_TOKEN"},
    }
    assert len(engine["PREFIXSCOPE_ENGINE_API_KEY"]) >= 40
    assert gateway["PREFIXSCOPE_UPSTREAM_API_KEY"] == engine["PREFIXSCOPE_ENGINE_API_KEY"]
    assert dashboard["PREFIXSCOPE_DASHBOARD_ENGINE_TOKEN"] == engine["PREFIXSCOPE_ENGINE_ADMIN_TOKEN"]
    assert engine["PREFIXSCOPE_ENGINE_ADMIN_TOKEN"] != engine["PREFIXSCOPE_ENGINE_API_KEY"]
    assert shared_secrets_env({})["engine"]["PREFIXSCOPE_ENGINE_API_KEY"] != engine["PREFIXSCOPE_ENGINE_API_KEY"]
    kept = shared_secrets_env({"PREFIXSCOPE_ENGINE_API_KEY": "mine", "PREFIXSCOPE_ENGINE_ADMIN_TOKEN": "admin"})
    assert kept["gateway"] == {"PREFIXSCOPE_UPSTREAM_API_KEY": "mine"}
    assert kept["dashboard"] == {"PREFIXSCOPE_DASHBOARD_ENGINE_TOKEN": "admin"}


def test_up_hands_each_child_its_own_environment(monkeypatch):
    """What `up` starts: every engine replica, the gateway and the dashboard, each with only its secrets."""
    monkeypatch.setenv("PREFIXSCOPE_ENGINE_API_KEY", "api-key")
    monkeypatch.setenv("PREFIXSCOPE_ENGINE_ADMIN_TOKEN", "admin-token")
    programs = {p.name: p for p in _run_up(monkeypatch, _args(replicas=2))["programs"]}
    secrets = {name: {k: v for k, v in p.env.items() if k in SECRETS} for name, p in programs.items()}
    engine = {"PREFIXSCOPE_ENGINE_API_KEY": "api-key", "PREFIXSCOPE_ENGINE_ADMIN_TOKEN": "admin-token"}
    expected = {"engine1": engine, "engine2": engine, "gateway": {"PREFIXSCOPE_UPSTREAM_API_KEY": "api-key"}}
    if "dashboard" in programs:
        expected["dashboard"] = {"PREFIXSCOPE_DASHBOARD_ENGINE_TOKEN": "admin-token"}
    assert secrets == expected


def test_the_gateway_is_open_only_with_open():
    gateway_argv = {p.name: p.argv for p in plan(_args())}["gateway"]
    assert "--open" not in gateway_argv
    gateway_argv = {p.name: p.argv for p in plan(_args(open=True))}["gateway"]
    assert "--open" in gateway_argv


def _run_up(monkeypatch, args: argparse.Namespace) -> dict:
    """Run `_up` with nothing started: what it hands to the supervisor."""
    import prefixscope.stack as stack

    seen: dict = {}

    def supervise(programs, start_timeout, env=None, ready_message=None):
        seen.update(programs=programs, ready_message=ready_message)
        return 0

    monkeypatch.setattr(stack, "supervise", supervise)
    monkeypatch.setattr(stack, "port_problems", lambda host, requests: [])
    assert stack._up(args) == 0
    return seen


def test_up_is_loud_when_the_config_file_makes_the_gateway_open(tmp_path, monkeypatch, capsys):
    """`auth = "none"` in the gateway's config is open mode as much as --open: `up` prints the banner and does not
    claim that keys are required (the config given with --config, or ./prefixscope.toml that the gateway reads)."""
    config = tmp_path / "open.toml"
    config.write_text('[gateway]\nauth = "none"\n')
    monkeypatch.chdir(tmp_path)
    seen = _run_up(monkeypatch, _args(config=config))
    assert "OPEN MODE" in capsys.readouterr().err
    assert "requires API keys" not in seen["ready_message"]

    (tmp_path / "prefixscope.toml").write_text('[gateway]\nauth = "none"\n')
    seen = _run_up(monkeypatch, _args())
    assert "OPEN MODE" in capsys.readouterr().err
    assert "requires API keys" not in seen["ready_message"]

    (tmp_path / "prefixscope.toml").write_text('[gateway]\nauth = "keys"\n')
    seen = _run_up(monkeypatch, _args())
    assert "OPEN MODE" not in capsys.readouterr().err
    assert "requires API keys" in seen["ready_message"]


def test_up_saves_the_engine_api_key_for_scraping(tmp_path, monkeypatch, capsys):
    """`up` writes the key its engines were given to `engine_api_key` in the state directory, owner-only (0600, also
    over a looser file left from before), and prints where; a fresh key at each start replaces the old one."""
    import stat

    monkeypatch.setenv("PREFIXSCOPE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PREFIXSCOPE_ENGINE_API_KEY", raising=False)
    key_file = tmp_path / "home" / "engine_api_key"
    keys = []
    for _ in range(2):
        programs = {p.name: p for p in _run_up(monkeypatch, _args(replicas=2))["programs"]}
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        assert key == programs["engine1"].env["PREFIXSCOPE_ENGINE_API_KEY"]
        assert key == programs["engine2"].env["PREFIXSCOPE_ENGINE_API_KEY"]
        assert key == programs["gateway"].env["PREFIXSCOPE_UPSTREAM_API_KEY"]
        assert str(key_file) in capsys.readouterr().out
        keys.append(key)
        key_file.chmod(0o644)
    assert keys[0] != keys[1]


def test_up_gives_the_engines_the_gateway_configs_export_headers(tmp_path, monkeypatch):
    """`[telemetry]` headers and export timeout reach the engines (through the OTEL_* variables the engine reads,
    merged with the environment's headers as the gateway merges them), and the engine's exporter uses them."""
    from local_engine.cli import trace_export_from

    config = tmp_path / "prefixscope.toml"
    config.write_text('[telemetry]\notlp_endpoint = "http://127.0.0.1:4399"\nexport_timeout_s = 2.5\n'
                      'headers = { "x-api-key" = "test 123,=%", "X-Tenant" = "acme" }\n')
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    for name in ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_TIMEOUT",
                 "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-extra=1")
    programs = {p.name: p for p in _run_up(monkeypatch, _args(replicas=2, config=config))["programs"]}
    for name in ("engine1", "engine2"):
        argv = programs[name].argv
        endpoint = argv[argv.index("--otlp-endpoint") + 1]
        export = trace_export_from(endpoint, programs[name].env)
        assert export.traces_url == "http://127.0.0.1:4399/v1/traces"
        assert export.headers == {"x-api-key": "test 123,=%", "x-tenant": "acme", "x-extra": "1"}
        assert export.export_timeout_s == 2.5
        assert export.service_name == "prefixscope-engine"
    assert "OTEL_EXPORTER_OTLP_TRACES_HEADERS" not in programs["gateway"].env
