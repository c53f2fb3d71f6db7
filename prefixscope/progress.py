"""Progress of long commands (benchmarks, demo data, simulation, trace export), always on standard error.

On a terminal it is a `rich` progress bar with the elapsed time and, when the total is known, an estimate of the
time left. Otherwise (a log file, CI, a pipe) it is one plain line every `interval_s` seconds and a last line at
the end, so logs show the work moving without a line per item. Standard output is never touched, so `--json`
output stays exactly the JSON document. `PREFIXSCOPE_PROGRESS=0` turns progress off, `=lines` forces lines; `PREFIXSCOPE_PROGRESS_INTERVAL_S` sets the
seconds between lines (10 by default).

Like `prefixscope.paths`, this module imports nothing from the programs: every package may use it.

    with progress("demo-data", total=rows, unit="rows") as bar:
        for batch in batches:
            ...
            bar.advance(len(batch))
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, TypeVar

ENV_PROGRESS = "PREFIXSCOPE_PROGRESS"
ENV_INTERVAL_S = "PREFIXSCOPE_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 10.0

T = TypeVar("T")


def format_duration(seconds: float) -> str:
    """`"45s"`, `"2m05s"`, `"1h02m"`."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


class Progress:
    """Progress of one piece of work: `advance` as it goes, or `iterate` over its items. A context manager."""

    def __init__(
        self,
        description: str,
        total: float | None = None,
        unit: str = "",
        *,
        stream: IO[str] | None = None,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.completed = 0.0
        self._stream = sys.stderr if stream is None else stream
        self._interval_s = _interval_from_env() if interval_s is None else interval_s
        self._clock = clock
        self._started = clock()
        self._last_line = self._started
        self._lines_written = 0
        mode = os.environ.get(ENV_PROGRESS, "").strip().lower()
        self._enabled = mode not in ("0", "off", "no", "false")
        self._bar: Any = None
        if self._enabled and mode != "lines" and _is_terminal(self._stream):
            self._bar = _RichBar(self)

    def __enter__(self) -> Progress:
        self._started = self._last_line = self._clock()
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self._enabled and exc_info[0] is None and self._clock() - self._started >= self._interval_s:
            self._write_line(done=True)

    def advance(self, amount: float = 1) -> None:
        """Count `amount` more units done."""
        self.completed += amount
        if self._bar is not None:
            self._bar.update()
        elif self._enabled and self._clock() - self._last_line >= self._interval_s:
            self._write_line(done=False)

    def describe(self, description: str) -> None:
        """Change the label (a new phase of the same work)."""
        self.description = description
        if self._bar is not None:
            self._bar.update()

    def iterate(self, items: Iterable[T]) -> Iterator[T]:
        """Yield `items`, advancing by one after each."""
        for item in items:
            yield item
            self.advance()

    def line(self, done: bool = False) -> str:
        """The plain-text line for the current state."""
        elapsed = self._clock() - self._started
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            share = min(1.0, self.completed / self.total)
            text = f"{self.description}: {_number(self.completed)}/{_number(self.total)}{unit} ({100 * share:.0f}%)"
        elif self.completed:
            text = f"{self.description}: {_number(self.completed)}{unit}"
        else:  # a single step of unknown length (loading a model, say): only the time
            text = self.description
        if done:
            return f"{text}, done in {format_duration(elapsed)}"
        text += f", {format_duration(elapsed)} elapsed"
        if self.total and 0 < self.completed < self.total:
            left = elapsed * (self.total - self.completed) / self.completed
            text += f", about {format_duration(left)} left"
        return text

    def _write_line(self, done: bool) -> None:
        self._last_line = self._clock()
        self._lines_written += 1
        print(self.line(done), file=self._stream, flush=True)


def _interval_from_env() -> float:
    try:
        return max(0.0, float(os.environ.get(ENV_INTERVAL_S, DEFAULT_INTERVAL_S)))
    except ValueError:
        return DEFAULT_INTERVAL_S


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _RichBar:
    """The terminal rendering of a `Progress`, with rich."""

    def __init__(self, state: Progress) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        self._state = state
        self._progress = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(state.unit),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(file=state._stream),
            # Standard output is the command's result (`export-trace --out - > trace.jsonl`): rich must not
            # capture it and print it on the bar's stream.
            redirect_stdout=False,
        )
        self._task = self._progress.add_task(state.description, total=state.total)

    def start(self) -> None:
        self._progress.start()

    def update(self) -> None:
        self._progress.update(self._task, completed=self._state.completed, description=self._state.description)

    def stop(self) -> None:
        self.update()
        self._progress.stop()


def progress(description: str, total: float | None = None, unit: str = "", **options: Any) -> Progress:
    """A `Progress` (see the module docstring); use it in a `with` block."""
    return Progress(description, total, unit, **options)


class timed:  # noqa: N801 - used like the function `progress`
    """Progress of work bounded by time (`seconds` expected): advanced by the clock from a background thread.

    The bar stops at 99% until the work ends, since the estimate may be short. Use it in a `with` block, or call
    `start()` and `stop()` (which may be called again, e.g. from a `finally`).
    """

    def __init__(self, description: str, seconds: float, **options: Any) -> None:
        self._progress = Progress(description, total=round(seconds, 1), unit="s", **options)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="progress-clock", daemon=True)
        self._stopped = False

    def _tick(self) -> None:
        started = time.monotonic()
        while not self._done.wait(0.5):
            expected = self._progress.total or 0.0
            target = min(time.monotonic() - started, 0.99 * expected)
            self._progress.advance(max(0.0, round(target - self._progress.completed, 1)))

    def start(self) -> timed:
        self._progress.__enter__()
        self._thread.start()
        return self

    def stop(self, completed: bool = True) -> None:
        if self._stopped or not self._thread.is_alive():
            return
        self._stopped = True
        self._done.set()
        self._thread.join()
        if completed and self._progress.total:
            self._progress.advance(self._progress.total - self._progress.completed)
        self._progress.__exit__(None if completed else RuntimeError, None, None)

    def __enter__(self) -> Progress:
        self.start()
        return self._progress

    def __exit__(self, *exc_info: object) -> None:
        self.stop(completed=exc_info[0] is None)
