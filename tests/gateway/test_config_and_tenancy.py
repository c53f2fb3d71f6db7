"""Config parsing, the server secret file, and salt derivation."""

from __future__ import annotations

import hashlib
import hmac
import stat
from pathlib import Path

import pytest

from gateway.config import ConfigOverrides, GatewayConfig, load_config, parse_config
from gateway.errors import ConfigError
from gateway.tenancy import SaltDeriver, derive_salt, load_or_create_secret

EXAMPLE = """
[gateway]
host = "0.0.0.0"
port = 9000
default_upstream = "engine"
max_body_bytes = 1024
server_secret = "s3cret"
database_url = "sqlite:///x.db"

[[upstreams]]
name = "engine"
url = "http://127.0.0.1:8001"
kind = "local_engine"
timeout = 30

[[upstreams]]
name = "hosted"
url = "https://api.example.test/v1"
kind = "openai"
api_key = "sk-upstream"

[routes]
"gpt-x" = "hosted"

[tenant_defaults]
store_prompt_text = true

[tenants.acme]
rules = { tool_order = false, hoist_volatile = true }
volatile_patterns = ['ticket-\\d+']
hoist_placement = "end"

[recorder]
batch_size = 64
"""


def test_full_config_file(tmp_path: Path):
    path = tmp_path / "prefixscope.toml"
    path.write_text(EXAMPLE)
    config = load_config(path)
    assert (config.host, config.port, config.max_body_bytes) == ("0.0.0.0", 9000, 1024)
    assert config.default_upstream == "engine"
    assert config.upstream("engine").timeout_s == 30
    hosted = config.upstream("hosted")
    assert hosted.kind == "openai" and hosted.api_key == "sk-upstream"
    assert hosted.api_base == "https://api.example.test/v1"
    assert config.upstream("engine").api_base == "http://127.0.0.1:8001/v1"
    assert config.routes == {"gpt-x": "hosted"}
    acme = config.tenant_settings("acme")
    assert "hoist_volatile" in acme.rules and "tool_order" not in acme.rules and "newlines" in acme.rules
    assert acme.volatile_patterns == (r"ticket-\d+",)
    assert acme.hoist_placement == "end"
    assert acme.store_prompt_text  # inherited from tenant_defaults
    other = config.tenant_settings("someone-else")
    assert other.store_prompt_text and "hoist_volatile" not in other.rules
    assert config.recorder.batch_size == 64


def test_defaults_proxy_to_local_engine():
    config = GatewayConfig()
    assert config.upstream(config.default_upstream).url == "http://127.0.0.1:8001"
    assert config.upstream(config.default_upstream).kind == "local_engine"
    assert (config.host, config.port) == ("127.0.0.1", 8080)
    assert not config.tenant_defaults.store_prompt_text
    assert "hoist_volatile" not in config.tenant_defaults.rules


def test_overrides_win():
    config = load_config(None, ConfigOverrides(host="0.0.0.0", port=1, upstream_url="http://127.0.0.1:9/v1"))
    assert (config.host, config.port) == ("0.0.0.0", 1)
    assert config.upstream("local").url == "http://127.0.0.1:9/v1"


@pytest.mark.parametrize(
    "document",
    [
        {"upstreams": [{"name": "a", "url": "http://x", "kind": "nonsense"}]},
        {"upstreams": [{"name": "a", "url": "ftp://x"}]},
        {"upstreams": [{"url": "http://x"}]},
        {"routes": {"m": "missing"}},
        {"tenants": {"t": {"rules": {"no_such_rule": True}}}},
        {"gateway": {"unknown_key": 1}},
        {"nonsense": {}},
        {"gateway": {"max_body_bytes": 0}},
        {"gateway": {"port": "eighty"}},
        {"tenants": {"t": {"volatile_patterns": ["("]}}},
        {"tenants": {"t": {"volatile_patterns": []}}},
        {"tenants": {"t": {"hoist_placement": "middle"}}},
        {"tenant_defaults": {"explain_history_size": 0}},
        {"tenant_defaults": {"uplift_sample_rate": 1.5}},
        {"tenant_defaults": {"uplift_sample_rate": "often"}},
        {"tenants": {"t": {"hash_block_size": 0}}},
        {"tenants": {"t": {"hash_block_size": 4096}}},
        {"tenants": {"t": {"hash_chain": "yes"}}},
    ],
)
def test_invalid_configs_are_rejected(document):
    with pytest.raises(ConfigError):
        parse_config(document)


def test_miss_explanation_settings_per_tenant_over_the_defaults():
    config = parse_config(
        {
            "tenant_defaults": {"explain_history_size": 50, "uplift_sample_rate": 0.5},
            "tenants": {"t": {"hash_chain": False, "hash_block_size": 32, "uplift_sample_rate": 0.0}},
        }
    )
    defaults, tenant = config.tenant_settings("other"), config.tenant_settings("t")
    assert (defaults.explain_history_size, defaults.uplift_sample_rate, defaults.hash_chain) == (50, 0.5, True)
    assert defaults.hash_block_size == 16
    assert (tenant.explain_history_size, tenant.uplift_sample_rate, tenant.hash_chain) == (50, 0.0, False)
    assert tenant.hash_block_size == 32
    plain = parse_config({}).tenant_defaults
    assert (plain.explain_history_size, plain.uplift_sample_rate, plain.hash_chain, plain.hash_block_size) == (
        1000,
        0.1,
        True,
        16,
    )


def test_unreadable_config(tmp_path: Path):
    with pytest.raises(ConfigError):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[gateway\n")
    with pytest.raises(ConfigError):
        load_config(bad)


def test_salt_is_hmac_sha256_of_tenant():
    expected = hmac.new(b"secret", b"acme", hashlib.sha256).hexdigest()
    assert derive_salt("secret", "acme") == expected
    deriver = SaltDeriver("secret")
    assert deriver.salt_for("acme") == expected
    assert deriver.salt_for("acme") != deriver.salt_for("other")
    assert SaltDeriver("another-secret").salt_for("acme") != expected
    with pytest.raises(ConfigError):
        SaltDeriver("")


def test_secret_file_is_created_0600_and_stable(tmp_path: Path):
    path = tmp_path / "nested" / "gateway_secret"
    first = load_or_create_secret(path)
    assert len(first) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_secret(path) == first  # stable across restarts


def test_secret_file_with_loose_mode_is_tightened(tmp_path: Path):
    path = tmp_path / "secret"
    path.write_text("abc\n")
    path.chmod(0o644)
    assert load_or_create_secret(path) == "abc"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_documented_example_config_loads(tmp_path: Path) -> None:
    """The README and docs/gateway.md send users to examples/prefixscope.toml: as it is, it must load."""
    root = Path(__file__).resolve().parents[2]
    path = root / "examples" / "prefixscope.toml"
    assert "examples/prefixscope.toml" in (root / "README.md").read_text()
    assert "examples/prefixscope.toml" in (root / "docs" / "gateway.md").read_text()
    config = load_config(path)
    assert config.default_upstream == "local"
    assert "acme" in config.tenants
    assert config.tenant_settings("acme").retention.effective("persistent") == "persistent"
    assert config.tenant_settings("acme").retention.effective(None) == "1h"
    # Every [telemetry] key is shown (the optional ones commented out).
    from dataclasses import fields

    from gateway.config.telemetry import TelemetrySettings

    section = path.read_text().split("[telemetry]", 1)[1].split("\n[", 1)[0]
    shown = {line.lstrip("# ").split(" ", 1)[0] for line in section.splitlines()[1:] if "=" in line}
    assert {f.name for f in fields(TelemetrySettings)} <= shown
