"""The prefix cache's bookkeeping at the grain of a *chain segment* (one entry per segment
instead of one per 512-token cache unit).

A :class:`Segment` is a run of consecutive cache units of one prompt chain that one
request registered (computed) or brought back from the CPU tier: positions
``[lo, end)`` of its ``keys``. The index maps each live segment's *first* unit's key to
it (:attr:`~sloserve.engine.prefix_cache.PrefixCachingKVManager._starts`); everything is
kept per segment, nothing per unit. That is exact because the cache is a *trie*:

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

- No unit is cached twice (a unit computed by another request too stays private), and
  keys chain (equal keys at ``p`` mean equal prefixes up to ``p``). So a chain that
  reaches position ``p`` through cached units (a lookup's walk, or a request's held
  prefix) goes on, if at all, either in the segment it is in (which may have grown past
  what the request holds: its owner registered more) or in a segment that *starts* at
  ``p``: any other segment holding ``p`` would hold the units before ``p`` a second
  time. A lookup, a registration's "cached already?" test and a router's peek therefore
  need only the segments' first units in the index.
- Cached units are prefix-closed on the GPU: a unit is never evicted before the units
  that continue its chain (a release frees a chain's tail first; a hit on a unit takes
  its whole prefix too), so past the end of a walk on the GPU only the CPU tier can hold
  more of the chain.

What this saves: registering, releasing and evicting a request's units cost one
operation per segment (a Mooncake prompt's ~24 units are 1–3 segments) and no index
update except when a segment is created or evicted whole.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence

__all__ = [
    "LRUEntry",
    "Segment",
    "agree_until",
    "cached_until",
    "evict",
    "new_top",
    "shared_units",
    "trim_lru",
]


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


def evict(
    lru: list[LRUEntry],
    i: int,
    n: int,
    starts: dict[int, Segment],
    host: OrderedDict[int, None] | None,
    cap: int,
) -> int:
    """Evict ``n`` unreferenced units, oldest first, from the LRU list's entry ``i`` on
    (there are that many): a segment's highest units go first, and a segment evicted whole
    leaves the index ``starts``; with a CPU tier (``host``, ``cap`` units) the evicted
    units' keys move there, the newest last. Returns the first entry not consumed."""
    while n:
        entry = lru[i]
        a, b = entry.a, entry.b
        if a >= b:  # dead: a hit took its units
            i += 1
            continue
        seg = entry.seg
        lo = b - n if b - n > a else a
        if lo == seg.lo:  # all of it
            del starts[seg.keys[lo]]
        if host is not None:
            for key in reversed(seg.keys[lo:b]):
                host[key] = None
                host.move_to_end(key)
                if len(host) > cap:
                    host.popitem(last=False)
        seg.end = entry.b = lo
        n -= b - lo
        if lo == a:  # consumed: it was the segment's oldest entry
            del seg.lru[0]
            i += 1
    return i


def cached_until(starts: dict[int, Segment], keys: Sequence[int]) -> int:
    """How many of a prompt's units ``keys`` are cached, from its first: a walk segment by
    segment (a chain goes on only at a segment's start), changing nothing."""
    n, p = len(keys), 0
    seg = starts.get(keys[0]) if n else None
    while seg is not None:
        lim = n if n < seg.end else seg.end
        if seg.keys[lim - 1] != keys[lim - 1]:  # the chains part inside it
            lim = agree_until(keys, seg.keys, p, lim)
        p = lim
        seg = starts.get(keys[p]) if p < n else None
    return p


def shared_units(chain: Sequence[Segment], rid: int) -> int:
    """How many of the units request ``rid`` holds (in the segments ``chain``) some other
    request holds too."""
    shared = 0
    for seg in chain:
        end = seg.holders[rid]
        other = max((e for r, e in seg.holders.items() if r != rid), default=seg.lo)
        shared += min(end, other) - seg.lo
    return shared
