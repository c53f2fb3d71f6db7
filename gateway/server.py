"""Running the gateway under uvicorn."""

from __future__ import annotations

import importlib.util
import logging
import sys

from gateway.config import GatewayConfig

log = logging.getLogger(__name__)

GIL_SWITCH_INTERVAL_S = 0.001


def best_loop_and_http() -> tuple[str, str]:
    """uvloop and httptools when installed (several times faster per request), else the pure-Python ones."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return loop, http


def serve(config: GatewayConfig, database_url: str, *, log_level: str = "info") -> None:
    """Start the gateway and block until it is stopped (Ctrl-C or SIGTERM)."""
    import uvicorn

    from gateway.app import create_app
    from gateway.storage import DatabaseStorage, StorageConfig

    storage = DatabaseStorage(
        StorageConfig(database_url=database_url, recorder=config.recorder, key_snapshot_path=config.key_snapshot_path)
    )
    app = create_app(config, storage, freeze_gc_after_start=True)
    # The record writer's database driver runs Python code in a worker thread; while it holds the GIL the event
    # loop waits up to the switch interval (5 ms by default) for it, which shows directly in tail latency.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    loop, http = best_loop_and_http()
    log.info(
        "gateway on http://%s:%d -> %s (database %s; traces %s)",
        config.host,
        config.port,
        ", ".join(f"{u.name}={u.url} [{u.kind}]" for u in config.upstreams),
        database_url.split("@")[-1],
        f"to {config.telemetry.otlp_endpoint}" if config.telemetry.otlp_endpoint else "off",
    )
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        loop=loop,
        http=http,
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        log_level=log_level,
        timeout_graceful_shutdown=10,
    )
