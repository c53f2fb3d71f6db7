"""An engine served over real HTTP (uvicorn on a free loopback port) inside the test process."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import uvicorn

from local_engine.config import EngineConfig, ServerConfig
from local_engine.engine.engine import Engine
from local_engine.api.server import create_app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def served_engine(loaded, admin_token: str | None = None, api_key: str | None = None, **engine_config):
    """Yields (base_url, engine) for an engine listening on 127.0.0.1; stops both afterwards."""
    engine = Engine(EngineConfig(**engine_config), loaded)
    engine.start()
    port = free_port()
    app = create_app(engine, ServerConfig(port=port, admin_token=admin_token, api_key=api_key))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", engine
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.stop()


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()
