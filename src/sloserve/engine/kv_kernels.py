"""The paged KV manager's hot loops, as plain functions over its containers.

:class:`~sloserve.engine.kv.PagedKVManager` is an extension point (the prefix cache and
BROS' manager subclass it, and so may users), so its module stays Python; these functions
hold the arithmetic of its per-decision methods so that the compiled build
(``SLOSERVE_COMPILE=1``, ``setup.py``'s list) compiles it. Each takes the manager's
containers (``tokens``: request → tokens held; ``tables``: request → its blocks; ``free``:
the free list, a stack) and its block size, and does exactly what the method did inline:
the same blocks, in the same order. A subclass overriding a method never reaches them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

# Request and block ids are ints, typed as type variables: compiled code then passes the
# caller's int objects through (dict keys, list items) instead of unboxing each to a C
# integer and allocating a new int object for every lookup (mypyc erases a type variable
# to a plain object). Only token counts are computed on.
R = TypeVar("R")
"""A request id."""
B = TypeVar("B")
"""A block id."""


def grow_many(
    tokens: dict[R, int],
    tables: dict[R, list[B]],
    free: list[B],
    bs: int,
    req_ids: Sequence[R],
    n_new_tokens: int,
) -> bool:
    """:meth:`~sloserve.engine.kv.PagedKVManager.grow_many`: all or nothing."""
    # Each request needs at most ceil(n / bs) + 1 blocks: count only when that might
    # not fit (the count is a second pass over the requests).
    if len(free) < len(req_ids) * (n_new_tokens // bs + 1):
        need = 0
        for r in req_ids:
            t = tokens[r] + n_new_tokens
            need += -(-t // bs) - len(tables[r])
        if need > len(free):
            return False
    grow(tokens, tables, free, bs, req_ids, n_new_tokens)
    return True


def grow(
    tokens: dict[R, int],
    tables: dict[R, list[B]],
    free: list[B],
    bs: int,
    req_ids: Sequence[R],
    n_new_tokens: int,
) -> None:
    """Each request of ``req_ids`` grows by ``n_new_tokens``, taking its new blocks from
    the top of ``free``, which the caller knows holds enough (:func:`grow_many` counted;
    the prefix cache reclaimed)."""
    if n_new_tokens == 1:
        # A single step's decodes: a request takes a block exactly when its last one is
        # full (a table holds ceil(tokens / bs) blocks: check_invariants), so its table
        # is looked up only then.
        for r in req_ids:
            t = tokens[r]
            tokens[r] = t + 1
            if not t % bs:
                tables[r].append(free.pop())
        return
    # A table holds ceil(tokens / bs) blocks, so the last one has -tokens % bs free
    # slots: the table is looked up only when the growth needs more than those.
    for r in req_ids:
        t = tokens[r]
        tokens[r] = t + n_new_tokens
        slack = -t % bs
        if n_new_tokens > slack:
            more = -((slack - n_new_tokens) // bs)  # ceil((n - slack) / bs)
            if more == 1:
                tables[r].append(free.pop())  # (free[-1:]: no slice to build)
            else:
                tables[r].extend(free[-more:])
                del free[-more:]


def shrink_many(
    tokens: dict[R, int],
    tables: dict[R, list[B]],
    free: list[B],
    bs: int,
    req_ids: Sequence[R],
    n_tokens: int,
) -> int:
    """:meth:`~sloserve.engine.kv.PagedKVManager.shrink_many`: each request gives back its
    last ``n_tokens``, in order. Returns -1, or the position in ``req_ids`` of the first
    request holding fewer than ``n_tokens`` (those before it are shrunk, it and those
    after are not: the caller raises there, as the method did)."""
    for i, r in enumerate(req_ids):
        had = tokens[r]
        t = had - n_tokens
        if t < 0:
            return i
        # A table holds ceil(tokens / bs) blocks: it is looked up only to give some back.
        extra = -(-had // bs) - -(-t // bs)
        if extra == 1:  # (the common cut, shorter than a block: no slice to build)
            free.append(tables[r].pop())
        elif extra > 0:
            table = tables[r]
            free.extend(reversed(table[-extra:]))  # shrink's order
            del table[-extra:]
        tokens[r] = t
    return -1


def decode_blocks_needed(tokens: dict[R, int], bs: int, req_ids: Sequence[R]) -> int:
    """:meth:`~sloserve.engine.kv.PagedKVManager.decode_blocks_needed`: a request needs a
    new block exactly when its last block is full."""
    return len([r for r in req_ids if tokens.get(r, 0) % bs == 0])  # faster than sum(gen)


def allocate(
    tokens: dict[R, int],
    tables: dict[R, list[B]],
    free: list[B],
    bs: int,
    req_id: R,
    n_new_tokens: int,
) -> list[B] | None:
    """:meth:`~sloserve.engine.kv.PagedKVManager.allocate` once the request is known not
    to be swapped out: the new blocks, or None (and no change)."""
    held = tokens.get(req_id, 0) + n_new_tokens
    table = tables.get(req_id)
    have = len(table) if table is not None else 0
    need = -(-held // bs) - have
    if need > len(free):
        return None
    if table is None:
        table = tables[req_id] = []
    new: list[B] = []
    if need > 0:
        new = free[-need:]
        del free[-need:]
        table.extend(new)
    tokens[req_id] = held
    return new
