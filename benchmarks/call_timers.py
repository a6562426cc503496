"""A timed wrapper for the benchmarks that count and time engine functions in process
(``engine_calls.py``, ``prefix_timers.py``): pure-Python installs only (a compiled
module's callers call the original, docs/performance.md "The compiled build")."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wrap(
    stats: dict[str, list[int]], owner: Any, name: str, label: str, *, own: bool = False
) -> Callable[..., Any]:
    """Replace ``owner.name`` by a wrapper adding its nanoseconds and calls to
    ``stats[label]``; returned, for modules that imported the function by name. ``own``:
    wrap the attribute ``owner`` itself defines (a subclass's override), not an inherited
    one."""
    from sloserve.engine import compiled

    if compiled():  # compiled callers would call the original: every count would read 0
        raise SystemExit("this benchmark needs the pure-Python install (not SLOSERVE_COMPILE=1)")
    real = owner.__dict__[name] if own else getattr(owner, name)
    acc = stats.setdefault(label, [0, 0])
    clock = time.perf_counter_ns

    def timed(*args: Any, **kwargs: Any) -> Any:
        t = clock()
        try:
            return real(*args, **kwargs)
        finally:
            acc[0] += clock() - t
            acc[1] += 1

    setattr(owner, name, timed)
    return timed
