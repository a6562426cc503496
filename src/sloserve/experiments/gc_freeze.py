"""Keep the garbage collector off the objects a simulation built before it runs.

A run builds its requests, instances and tables first (tens of thousands of long-lived
objects: a Mooncake trace carries a list of block hashes per request) and then creates
short-lived ones by the million. CPython's cyclic collector walks every tracked object in
its full collections, so with the long-lived ones in the oldest generation each full pass
re-walks all of them for nothing: they live until the run ends. :func:`frozen` moves what
exists when the run starts into the permanent generation (:func:`gc.freeze`) for the
run's duration and back afterwards; objects created during the run are collected as
usual, so a cycle made and dropped mid-run is still freed. It changes speed only, never a
result (the collector decides when memory is returned, not what is computed).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen() -> Iterator[None]:
    """Freeze the objects alive now out of the collector's passes until the block ends.

    Nested or concurrent uses are harmless: the outermost exit unfreezes (what the inner
    ones froze is then collectable again, as it would be without this)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
