"""The prefix cache's bookkeeping at the grain of a *chain segment* (one entry per segment
instead of one per 512-token cache unit).

A :class:`Segment` is a run of consecutive cache units of one prompt chain that one
request registered (computed) or brought back from the CPU tier: positions
``[lo, end)`` of its ``keys``. Every cached unit's key maps to its segment
(:attr:`~sloserve.engine.prefix_cache.PrefixCachingKVManager._unit`); everything else is
kept per segment, not per unit. That is exact because the cache is a *trie*:

- A request holds a prefix chain (units ``0 .. E``), so whoever holds a unit of a
  segment at ``p`` holds the segment's units ``[lo, p]`` too: a holder is one number per
  segment, the end of what it holds there (:attr:`Segment.holders`), and a unit's
  reference count is the number of holders whose end lies beyond it. Referenced units
  are therefore ``[lo, top)`` with ``top`` the largest end, unreferenced ones
  ``[top, end)``.
- Reference counts never rise along a chain, and a release frees a chain tail first, so
  LRU eviction always takes a segment's *highest* cached unit: a segment's live units stay
  ``[lo, end)``, and what became unreferenced together (one release) is one LRU entry
  (:class:`LRUEntry`) — units ``[a, b)``, evicted from ``b`` down. A hit takes a segment's
  units from ``lo`` up: it trims the segment's newest entries from below (an entry it
  empties is dead, and eviction skips it). The segment keeps its live entries, oldest
  first (:attr:`Segment.lru`): together they cover ``[top, end)`` exactly.
- All holders of a unit share its blocks at the same place in their tables (unit ``p``
  is blocks ``[p·u, (p+1)·u)`` of each), so a referenced unit's blocks are read from any
  holder's table (:attr:`Segment.ref`, one whose end is ``top``); an unreferenced
  unit's blocks lie anonymous on the free list (``prefix_cache``'s docstring).

What this saves: registering, releasing and evicting a request's units cost one
operation per segment (a Mooncake prompt's ~24 units are 1–3 segments) plus, for the
key index only, C-level bulk dictionary updates.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["LRUEntry", "Segment", "agree_until", "new_top", "trim_lru"]


class Segment:
    """Units ``[lo, end)`` of the chain ``keys`` (module docstring)."""

    __slots__ = ("end", "holders", "keys", "lo", "lru", "owner", "ref", "top")

    def __init__(self, keys: tuple[int, ...], lo: int, owner: int) -> None:
        self.keys = keys
        """The chain's unit keys (the registering request's): unit ``p`` is ``keys[p]``."""
        self.lo = lo
        """The segment's first position."""
        self.end = lo
        """Units ``[lo, end)`` are cached; above, never registered here or evicted."""
        self.top = lo
        """Units ``[lo, top)`` are referenced: the largest of :attr:`holders`' ends."""
        self.ref = owner
        """A holder whose end is :attr:`top` (whose table has the referenced units)."""
        self.holders: dict[int, int] = {}
        """Request -> the end of the units it holds here."""
        self.lru: list[LRUEntry] = []
        """This segment's live LRU entries, oldest (highest units) first."""
        self.owner: int | None = owner
        """The request that registers its computed units here, until it releases them."""


class LRUEntry:
    """Units ``[a, b)`` of ``seg`` that became unreferenced together; dead when empty."""

    __slots__ = ("a", "b", "seg")

    def __init__(self, seg: Segment, a: int, b: int) -> None:
        self.seg = seg
        self.a = a
        self.b = b


def new_top(seg: Segment) -> int:
    """The holder with the largest end becomes :attr:`Segment.ref`; returns that end
    (``lo`` when nobody holds the segment)."""
    holders = seg.holders
    if not holders:
        return seg.lo
    top = max(holders.values())
    for rid, end in holders.items():
        if end == top:
            seg.ref = rid
            break
    return top


def trim_lru(seg: Segment, upto: int) -> None:
    """A hit took the segment's units below ``upto``: its LRU entries lose them (an
    entry left empty is dead: eviction skips it)."""
    lru = seg.lru
    while lru:
        entry = lru[-1]  # the newest: the lowest units
        if entry.b <= upto:
            entry.a = entry.b
            lru.pop()
        else:
            if entry.a < upto:
                entry.a = upto
            return


def agree_until(keys: Sequence[int], other: Sequence[int], p: int, lim: int) -> int:
    """The end of the run of positions from ``p`` on, below ``lim``, where two prompts'
    unit keys agree (they agree at ``p``, not at ``lim - 1``). Keys chain (a key names
    its whole prefix), so they agree up to a point and never again: a binary search."""
    return p + 1 + bisect.bisect_left(range(p + 1, lim), True, key=lambda q: keys[q] != other[q])
