"""Serving from start to stop: warm up, then start the engine and say it is ready; on SIGTERM/SIGINT stop admitting,
let in-flight requests finish within a grace period, cancel the rest, release everything, say what was drained, and
let the process exit 0.

The HTTP server listens from the start, so `/health` answers 503 `starting` while the warm-up
(local_engine.engine.warm_up) runs and 200 once `ready` is set. Requests that arrive before then wait in the queue.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time

import uvicorn

from local_engine.engine.engine import Engine
from local_engine.engine.warm_up import WarmUpStopped, warm_up

log = logging.getLogger("local_engine.engine")  # the engine's start, ready and stop lines


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which on a stop signal also drains the engine: new requests get a 503 at once, running
    ones may finish within `grace_s` seconds and are then cancelled (their clients get an error), so the open
    connections close and uvicorn's own graceful shutdown completes."""

    def __init__(self, config: uvicorn.Config, engine: Engine, grace_s: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.grace_s = grace_s
        self.drain: DrainRecord | None = None

    def handle_exit(self, sig, frame) -> None:
        if self.drain is None:
            self.drain = DrainRecord.begin(self.engine, signal.Signals(sig).name if sig else "stop")
        self.engine.begin_drain(self.grace_s)
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            yield
            # The signal was handled by draining: exit normally (status 0) instead of uvicorn re-raising it.
            self._captured_signals.clear()


class DrainRecord:
    """What the engine held when the stop began, to say at the end what became of it."""

    def __init__(self, reason: str, running: int, waiting: int, finished: int, failed: int) -> None:
        self.reason, self.running, self.waiting = reason, running, waiting
        self._finished, self._failed = finished, failed
        self._started = time.monotonic()

    @classmethod
    def begin(cls, engine: Engine, reason: str) -> DrainRecord:
        # Lock-free reads: this runs in the signal handler, on the thread that may hold `tree_lock` at that moment.
        scheduler, counters = engine.scheduler, engine.counters
        return cls(reason, len(scheduler.running), len(scheduler.waiting), counters.finished_requests,
                   counters.failed_requests)

    def describe(self, engine: Engine, grace_s: float, drained: bool) -> str:
        """One line: the signal, the requests in flight then, how many finished and how many were cancelled."""
        finished = engine.counters.finished_requests - self._finished
        cancelled = engine.counters.failed_requests - self._failed
        return (f"engine stopped on {self.reason}: {self.running} running and {self.waiting} waiting request(s) at "
                f"the signal; {finished} finished within the {grace_s:g} s grace, {cancelled} cancelled; "
                f"{'drained' if drained else 'not drained'} in {time.monotonic() - self._started:.1f} s")


class EngineStarter:
    """Warms the engine up, starts it and sets `ready`, on its own thread, while the server already listens. A stop
    requested before then (`should_stop`) ends the warm-up between two phases and the engine never starts."""

    def __init__(self, engine: Engine, ready: threading.Event, should_stop, on_error, warm: bool = True,
                 on_started=None) -> None:
        """`should_stop()`: whether the server is stopping; `on_error()`: called when the engine cannot start;
        `on_started()`: called once it has started, before `ready` is set."""
        self.engine, self.ready, self.should_stop, self.on_error, self.warm = engine, ready, should_stop, on_error, warm
        self.on_started = on_started
        self.started = False
        self.error: BaseException | None = None  # why the engine could not start (OSError: a KV events address)
        self._thread = threading.Thread(target=self._run, name="engine-start", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def _run(self) -> None:
        began = time.perf_counter()
        try:
            if self.warm:
                report = warm_up(self.engine, self.should_stop)
                log.info("engine %s", report.describe())
            if self.should_stop():
                return
            self.engine.start()
            self.started = True
            if self.on_started is not None:
                self.on_started()
        except WarmUpStopped:
            return
        except BaseException as error:  # noqa: BLE001 - returned by `serve`, which stops the server
            self.error = error
            self.on_error()
            return
        self.ready.set()
        log.info("engine ready %.1f s after the server started", time.perf_counter() - began)


def serve(app, engine: Engine, host: str, port: int, log_level: str, grace_s: float,
          ready: threading.Event | None = None, warm: bool = True, on_started=None) -> BaseException | None:
    """Run `app` until a stop signal; returns once the engine has drained and the server has closed. With `ready`
    (the event the app's `/health` reads), the engine is warmed up (`warm`) and started on a thread while the server
    listens, `on_started()` is called and `ready` is set then; without it the caller has started the engine.
    Returns None, or the error that kept the engine from starting (the server is then stopped)."""
    # uvicorn's own limit is a backstop a little past the engine's: by then every request has ended. Its access log
    # is off: the engine writes its own line per request (local_engine.api.access_log).
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=grace_s + 5,
                            access_log=False)
    server = DrainingServer(config, engine, grace_s)
    starter = None
    if ready is not None:
        starter = EngineStarter(engine, ready, lambda: server.should_exit,
                                lambda: setattr(server, "should_exit", True), warm, on_started)
        starter.start()
    server.run()
    if starter is not None:
        starter.join()
        if not starter.started:
            log.info("engine stopped before it was ready")
            return starter.error
    record = server.drain or DrainRecord.begin(engine, "server exit")
    engine.begin_drain(0)
    drained = engine.wait_drained(timeout_s=grace_s + 5)
    log.info("%s", record.describe(engine, grace_s, drained))
    return None
