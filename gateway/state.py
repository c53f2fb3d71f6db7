"""Where the gateway keeps its files when the config does not say: the per-user state directory.

The server secret, the key snapshot and the spill file default to `gateway_secret`, `key_snapshot.json` and
`spill/gateway_requests.jsonl` under
`prefixscope.paths.state_dir()` (`$PREFIXSCOPE_HOME`, else the XDG data directory), so a gateway started from any
working directory derives the same cache salts and finds the same pending records. Paths set in the config file are
kept as written.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gateway.config import DEFAULT_KEY_SNAPSHOT_PATH, DEFAULT_SECRET_FILE, DEFAULT_SPILL_PATH, GatewayConfig

SPILL_FILE_NAME = "gateway_requests.jsonl"


def place_state(config: GatewayConfig, state_dir: Path) -> GatewayConfig:
    """`config` with the secret file, key snapshot and spill path moved under `state_dir` where they were left at their defaults."""
    changes: dict[str, object] = {}
    if config.secret_file == DEFAULT_SECRET_FILE:
        changes["secret_file"] = state_dir / "gateway_secret"
    if config.key_snapshot_path == DEFAULT_KEY_SNAPSHOT_PATH:
        changes["key_snapshot_path"] = state_dir / "key_snapshot.json"
    if config.recorder.spill_path == DEFAULT_SPILL_PATH:
        changes["recorder"] = replace(config.recorder, spill_path=state_dir / "spill" / SPILL_FILE_NAME)
    return replace(config, **changes) if changes else config  # type: ignore[arg-type]
