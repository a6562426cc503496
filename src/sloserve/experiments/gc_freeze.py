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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from sloserve.core import process_freeze

_P = ParamSpec("_P")
_T = TypeVar("_T")

_paused = 0
"""Open :func:`paused` blocks that turned the collector off (it was on when they began)."""


@contextmanager
def frozen() -> Iterator[None]:
    """Freeze the objects alive now out of the collector's passes until the block ends.

    Nested or concurrent uses are harmless: the outermost exit unfreezes (what the inner
    ones froze is then collectable again, as it would be without this). Inside a
    :func:`paused` block the collector is on for this block (the run), off again after."""
    gc.freeze()  # first: switching the collector on must not start a pass over them
    resume = _paused > 0 and not gc.isenabled()
    if resume:
        gc.enable()
    try:
        yield
    finally:
        if resume:
            gc.disable()
        gc.unfreeze()
        process_freeze.forget()  # the CLI import's freeze went with the rest


@contextmanager
def paused() -> Iterator[None]:
    """The cyclic collector off until the block ends (then on again, if it was on), except
    inside a :func:`frozen` block within it."""
    global _paused
    if not gc.isenabled():  # off already (another paused block, or the caller's choice)
        yield
        return
    gc.disable()
    _paused += 1
    try:
        yield
    finally:
        _paused -= 1
        gc.enable()


def paused_build(f: Callable[_P, _T]) -> Callable[_P, _T]:
    """``f`` run under :func:`paused`: for a function that builds a run, runs it under
    :func:`frozen` and tabulates its results."""

    @functools.wraps(f)
    def g(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with paused():
            return f(*args, **kwargs)

    return g
