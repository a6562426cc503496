"""One progress bar for every long command (compare, sweep, the reproductions, optimal).

On a terminal it is a rich bar with done/total, elapsed time and an ETA; with ``--json``,
or when the output is not a terminal (a pipe, a file, CI), it is silent, so that machine
readers get only what they asked for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sloserve.cli._app import console as _console

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID


class Bar:
    """Callbacks for a running bar: ``bar(done, total)`` for one stage, ``bar.stage(name,
    done, total)`` for several (each its own line)."""

    def __init__(self, progress: Progress | None, label: str) -> None:
        self._progress = progress
        self._label = label
        self._tasks: dict[str, TaskID] = {}

    def __call__(self, done: int, total: int | None) -> None:
        self.stage(self._label, done, total)

    def stage(self, name: str, done: float, total: float | None) -> None:
        if self._progress is None:
            return
        if name not in self._tasks:
            self._tasks[name] = self._progress.add_task(name, total=total)
        self._progress.update(self._tasks[name], completed=done, total=total)


def is_quiet(as_json: bool = False, console: Console | None = None) -> bool:
    """No bar under ``--json`` or when output is not a terminal."""
    return as_json or not (console or _console).is_terminal


@contextmanager
def progress_bar(
    label: str, *, as_json: bool = False, console: Console | None = None
) -> Iterator[Bar]:
    """A bar (done/total, elapsed, ETA) shown while the block runs, and cleared after it.
    Quiet (:func:`is_quiet`): the callbacks do nothing and rich is not imported."""
    con = console or _console
    if is_quiet(as_json, con):
        yield Bar(None, label)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=con,
        transient=True,
    ) as progress:
        yield Bar(progress, label)


@contextmanager
def timed_bar(
    label: str, limit_s: float, *, as_json: bool = False, console: Console | None = None
) -> Iterator[None]:
    """A bar for one task bounded by a wall-clock limit (a solver's): it fills with elapsed
    time against ``limit_s``, so its ETA is the worst case; the task may end sooner."""
    with progress_bar(label, as_json=as_json, console=console) as bar:
        if bar._progress is None:
            yield
            return
        stop = threading.Event()
        start = time.monotonic()

        def tick() -> None:
            while not stop.wait(0.2):
                bar.stage(label, min(time.monotonic() - start, limit_s), limit_s)

        bar.stage(label, 0.0, limit_s)
        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
