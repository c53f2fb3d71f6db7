"""Graceful stop on SIGTERM/SIGINT: stop admitting, let in-flight requests finish within a grace period, cancel
the rest, release everything, and let the process exit 0."""

from __future__ import annotations

import contextlib

import uvicorn

from local_engine.engine.engine import Engine


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which on a stop signal also drains the engine: new requests get a 503 at once, running
    ones may finish within `grace_s` seconds and are then cancelled (their clients get an error), so the open
    connections close and uvicorn's own graceful shutdown completes."""

    def __init__(self, config: uvicorn.Config, engine: Engine, grace_s: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.grace_s = grace_s

    def handle_exit(self, sig, frame) -> None:
        self.engine.begin_drain(self.grace_s)
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            yield
            # The signal was handled by draining: exit normally (status 0) instead of uvicorn re-raising it.
            self._captured_signals.clear()


def serve(app, engine: Engine, host: str, port: int, log_level: str, grace_s: float) -> None:
    """Run `app` until a stop signal; returns once the engine has drained and the server has closed."""
    # uvicorn's own limit is a backstop a little past the engine's: by then every request has ended.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=grace_s + 5)
    DrainingServer(config, engine, grace_s).run()
    engine.begin_drain(0)
    engine.wait_drained(timeout_s=grace_s + 5)
