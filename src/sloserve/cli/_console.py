"""The CLI's rich consoles and tables, built on first use (start-up time).

Importing rich's console costs ~15 ms of CPU, which a ``simulate --json`` run (it prints
JSON, never a rich table) need not pay. :func:`lazy_console` returns a stand-in that
builds the real :class:`rich.console.Console` the first time anything reads or sets an
attribute of it, and forwards every access from then on (tests set ``_width`` on it). The
width rule is the one the eager consoles had, taken when the console is built.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


class _LazyConsole:
    """Builds the console on first attribute access (module docstring)."""

    __slots__ = ("_real", "_stderr", "_tty_width")

    def __init__(self, *, stderr: bool, width: int) -> None:
        object.__setattr__(self, "_stderr", stderr)
        object.__setattr__(self, "_tty_width", width)
        object.__setattr__(self, "_real", None)

    def _console(self) -> Console:
        real = object.__getattribute__(self, "_real")
        if real is None:
            from rich.console import Console

            stderr = object.__getattribute__(self, "_stderr")
            stream = sys.stderr if stderr else sys.stdout
            # Wide enough for tables when output goes to a file or a CI log.
            width = None if stream.isatty() else object.__getattribute__(self, "_tty_width")
            real = Console(stderr=stderr, width=width)
            object.__setattr__(self, "_real", real)
        return cast("Console", real)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._console(), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._console(), name)


def lazy_console(*, stderr: bool = False, width: int) -> Console:
    """A console built on first use; ``width`` when the stream is not a terminal."""
    return cast("Console", _LazyConsole(stderr=stderr, width=width))


def new_table(*args: Any, **kwargs: Any) -> Table:
    """A :class:`rich.table.Table` (``rich.table`` imported on first use: ~20 ms of CPU that
    a command printing no table, such as ``simulate --json``, need not pay)."""
    from rich.table import Table

    return Table(*args, **kwargs)
