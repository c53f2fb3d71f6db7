"""The CPU time a coroutine spends on the event loop: each of its steps timed with `time.thread_time()`.

An estimate's work on the loop comes in steps between its awaits (building a dry-run payload, encoding and decoding
JSON, the HTTP client's request and response handling); the time between steps belongs to other tasks and is not
counted. Awaiting `Metered(coro)` runs `coro` exactly as awaiting it directly would (results, exceptions and
cancellation pass through unchanged) and adds each step's CPU seconds to `cpu_s`.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Metered(Generic[T]):
    """Awaitable wrapper of one coroutine; `cpu_s` is the CPU seconds of its steps so far (the loop's thread)."""

    __slots__ = ("_coro", "cpu_s")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro = coro
        self.cpu_s = 0.0

    def __await__(self) -> Generator[Any, Any, T]:
        coro = self._coro
        value: Any = None
        error: BaseException | None = None
        while True:
            started = time.thread_time()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            finally:
                self.cpu_s += time.thread_time() - started
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # cancellation (or any error) thrown into the awaiting task goes on in
                value, error = None, exc
