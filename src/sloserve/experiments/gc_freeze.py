"""Keep the garbage collector off the objects a simulation built before it runs.

A run builds its requests, instances and tables first (tens of thousands of long-lived
objects: a Mooncake trace carries a list of block hashes per request) and then creates
short-lived ones by the million. CPython's cyclic collector walks every tracked object in
its full collections, so with the long-lived ones in the oldest generation each full pass
re-walks all of them for nothing: they live until the run ends. :func:`frozen` moves what
exists when the run starts into the permanent generation (:func:`gc.freeze`) for the
run's duration and back afterwards; objects created during the run are collected as
usual, so a cycle made and dropped mid-run is still freed.

:func:`paused` keeps the collector off while such objects are built (reading a
16,384-request trace ran one full pass and ~90 young ones, ≈ 25 ms of CPU, that freed
nothing); a :func:`frozen` block inside it has the collector on for the run itself.
Reference counting still frees what a paused block drops; only a dropped cycle waits for
the next pass. Both change speed only, never a result (the collector decides when memory
is returned, not what is computed).

The command line's own import freeze (what ``sloserve.cli``'s import built, frozen until
a command starts) is ``core/process_freeze.py``.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from sloserve.core import process_freeze

_P = ParamSpec("_P")
_T = TypeVar("_T")

_lock = threading.Lock()
"""Guards the two counts and the collector switches: runs may be built and run from
several threads at once (``sloserve.simulate`` in a thread pool), and the collector's
state is process-wide."""

_paused = 0
"""Open :func:`paused` blocks that own the collector's switch (it was on when the first
of them began)."""

_frozen = 0
"""Open :func:`frozen` blocks."""


def _apply() -> None:
    """Set the collector from the counts (under the lock): while paused blocks are open it
    is on exactly when a frozen block (a run) is open too. Computed from the counts, not
    remembered per block, so any interleaving of enters and exits ends with the collector
    as it was before the first block."""
    if _paused:
        if _frozen:
            gc.enable()
        else:
            gc.disable()


@contextmanager
def frozen() -> Iterator[None]:
    """Freeze the objects alive now out of the collector's passes until the block ends.

    Nested or concurrent uses are harmless: the last block to end unfreezes (what the
    others froze is then collectable again, as it would be without this). Inside a
    :func:`paused` block the collector is on while a frozen block is open (the run), off
    again after."""
    global _frozen
    with _lock:
        gc.freeze()  # first: switching the collector on must not start a pass over them
        _frozen += 1
        _apply()
    try:
        yield
    finally:
        with _lock:
            _frozen -= 1
            _apply()
            if not _frozen:
                gc.unfreeze()
                process_freeze.forget()  # the CLI import's freeze went with the rest


@contextmanager
def paused() -> Iterator[None]:
    """The cyclic collector off until the block ends (then on again), except while a
    :func:`frozen` block is open; a collector the caller had turned off stays off."""
    global _paused
    with _lock:
        # Joins the open blocks (the collector may be on: a run is open), or takes the
        # switch when the collector is on; off by the caller's choice: left alone.
        owns = _paused > 0 or gc.isenabled()
        if owns:
            _paused += 1
            _apply()
    try:
        yield
    finally:
        if owns:
            with _lock:
                _paused -= 1
                if _paused:
                    _apply()
                else:
                    gc.enable()  # as it was when the first block began


def paused_build(f: Callable[_P, _T]) -> Callable[_P, _T]:
    """``f`` run under :func:`paused`: for a function that builds a run, runs it under
    :func:`frozen` and tabulates its results."""

    @functools.wraps(f)
    def g(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with paused():
            return f(*args, **kwargs)

    return g
