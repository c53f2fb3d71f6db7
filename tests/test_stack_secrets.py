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


def test_a_generated_engine_key_is_shared_with_the_gateway_and_dashboard():
    env = shared_secrets_env({"PATH": "/bin"})
    assert env["PATH"] == "/bin"
    assert len(env["PREFIXSCOPE_ENGINE_API_KEY"]) >= 40
    assert env["PREFIXSCOPE_UPSTREAM_API_KEY"] == env["PREFIXSCOPE_ENGINE_API_KEY"]
    assert env["PREFIXSCOPE_DASHBOARD_ENGINE_TOKEN"] == env["PREFIXSCOPE_ENGINE_ADMIN_TOKEN"]
    assert env["PREFIXSCOPE_ENGINE_ADMIN_TOKEN"] != env["PREFIXSCOPE_ENGINE_API_KEY"]
    assert shared_secrets_env({})["PREFIXSCOPE_ENGINE_API_KEY"] != env["PREFIXSCOPE_ENGINE_API_KEY"]
    kept = shared_secrets_env({"PREFIXSCOPE_ENGINE_API_KEY": "mine"})
    assert kept["PREFIXSCOPE_UPSTREAM_API_KEY"] == "mine"


def test_the_gateway_is_open_only_with_open():
    gateway_argv = {p.name: p.argv for p in plan(_args())}["gateway"]
    assert "--open" not in gateway_argv
    gateway_argv = {p.name: p.argv for p in plan(_args(open=True))}["gateway"]
    assert "--open" in gateway_argv


def _run_up(monkeypatch, args: argparse.Namespace) -> dict:
    """Run `_up` with nothing started: what it hands to the supervisor."""
    import prefixscope.stack as stack

    seen: dict = {}

    def supervise(programs, start_timeout, env, ready_message):
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
