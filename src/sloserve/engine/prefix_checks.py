"""The prefix-caching KV manager's invariant check (kept apart from its hot paths).

:func:`check_prefix_cache` rebuilds, from the requests' tables and the segments they hold,
what :class:`~sloserve.engine.prefix_cache.PrefixCachingKVManager` keeps incrementally per
chain segment (engine/prefix_segments.py) — the index of segments by their first unit's
key (and that no unit is cached twice), each segment's holders and
referenced range, where blocks are, the LRU entries and their order — and raises
:class:`~sloserve.engine.kv.KVInvariantError` on the first difference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sloserve.engine.kv import KVInvariantError

if TYPE_CHECKING:
    from sloserve.engine.prefix_cache import PrefixCachingKVManager
    from sloserve.engine.prefix_segments import Segment


def check_prefix_cache(kv: PrefixCachingKVManager) -> dict[int, str]:
    """Check the cache's bookkeeping; the owner of every GPU block found (free, in a
    cached unit, private to a request), for the paged manager's accounting check."""
    u = kv.unit_blocks
    owner: dict[int, str] = {}

    def own(b: int, who: str) -> None:
        if b in owner:
            raise KVInvariantError(f"block {b} is both {owner[b]} and {who}")
        owner[b] = who

    # Unreferenced cached units' blocks are on the free list (anonymous).
    for b in kv._free:
        own(b, "free")
    if kv._spare < 0:
        raise KVInvariantError(f"{kv._cached} unreferenced cached units, {len(kv._free)} free")
    segs: dict[int, Segment] = {id(s): s for s in kv._starts.values()}
    for rid, chain in kv._held.items():
        if rid not in kv._tables:
            raise KVInvariantError(f"request {rid} holds cached units but no blocks")
        for seg in chain:
            if id(seg) not in segs:
                raise KVInvariantError(f"request {rid} holds a segment that is not cached")
    _check_segments(kv, segs)
    shared: set[int] = set()  # keys of held units whose blocks are owned already
    for rid, table in kv._tables.items():
        if len(table) != kv._blocks_for(kv._tokens[rid]):
            tokens = kv._tokens[rid]
            raise KVInvariantError(f"request {rid}: {len(table)} blocks for {tokens} tokens")
        at = 0
        keys = kv._keys.get(rid)
        for seg in kv._held.get(rid, []):
            end = seg.holders.get(rid)
            if end is None or seg.lo != at or end <= at:
                raise KVInvariantError(f"request {rid}: its segments do not chain at unit {at}")
            if keys is not None and keys[at:end] != seg.keys[at:end]:
                raise KVInvariantError(f"request {rid}: units {at}..{end} are another prompt's")
            ref = kv._tables.get(seg.ref, [])
            for p in range(at, end):
                blocks = table[p * u : (p + 1) * u]
                if len(blocks) != u or ref[p * u : (p + 1) * u] != blocks:
                    raise KVInvariantError(f"request {rid}: unit {p} is not its cached unit")
                key = seg.keys[p]
                if key not in shared:  # a shared unit's blocks are owned once
                    shared.add(key)
                    for b in blocks:
                        own(b, f"in cached unit {key}")
            at = end
        for b in table[at * u :]:
            own(b, f"private to request {rid}")
    if len(kv._host) > kv.cpu_cache_units:
        raise KVInvariantError(f"CPU cache holds {len(kv._host)} units, over capacity")
    return owner


def reference_counts(kv: PrefixCachingKVManager) -> dict[int, int]:
    """Holders of every cached unit, by key (0: cached, unreferenced): a unit's holders
    are those whose end in its segment lies beyond it."""
    counts = {}
    for seg in {id(s): s for s in kv._starts.values()}.values():
        for p in range(seg.lo, seg.end):
            counts[seg.keys[p]] = sum(1 for end in seg.holders.values() if end > p)
    return counts


def _check_segments(kv: PrefixCachingKVManager, segs: dict[int, Segment]) -> None:
    """Each segment's index entries, holders, referenced range and LRU entries; the
    unreferenced count; the global LRU list's live entries and their order."""
    place = {id(e): i for i, e in enumerate(kv._lru[kv._lru_head :]) if e.a < e.b}
    live: set[int] = set()  # every cached unit's key: none is cached twice
    indexed = cached = 0
    entries = 0
    for seg in segs.values():
        if not seg.lo < seg.end or not seg.lo <= seg.top <= seg.end <= len(seg.keys):
            raise KVInvariantError(f"segment at {seg.lo}: top {seg.top}, end {seg.end}")
        if kv._starts.get(seg.keys[seg.lo]) is not seg:
            raise KVInvariantError(f"segment at {seg.lo}: not indexed by its first unit")
        live.update(seg.keys[seg.lo : seg.end])
        indexed += seg.end - seg.lo
        top = max(seg.holders.values(), default=seg.lo)
        if seg.top != top or (seg.holders and seg.holders.get(seg.ref) != top):
            raise KVInvariantError(f"segment at {seg.lo}: top {seg.top}, holders {seg.holders}")
        for rid, end in seg.holders.items():
            if not seg.lo < end <= seg.end or all(s is not seg for s in kv._held.get(rid, [])):
                raise KVInvariantError(f"segment at {seg.lo}: holder {rid} holds nothing here")
        at, last = seg.end, -1
        for e in seg.lru:  # oldest first: they cover [top, end) from the top down
            if e.seg is not seg or e.b != at or e.a >= e.b or place.get(id(e), -1) <= last:
                raise KVInvariantError(f"segment at {seg.lo}: LRU entries out of order")
            at, last = e.a, place[id(e)]
        if at != seg.top:
            raise KVInvariantError(f"segment at {seg.lo}: LRU entries end at {at}, top {seg.top}")
        cached += seg.end - seg.top
        entries += len(seg.lru)
    if indexed != len(live):
        raise KVInvariantError(f"{indexed} units cached in segments, {len(live)} distinct")
    for seg in segs.values():  # prefix-closed: a cached unit's parent is cached
        if seg.lo and seg.keys[seg.lo - 1] not in live:
            raise KVInvariantError(f"segment at {seg.lo}: the unit before it is not cached")
    if kv._cached != cached:
        raise KVInvariantError(f"{kv._cached} unreferenced cached units counted, {cached} found")
    if entries != len(place):
        raise KVInvariantError(f"{len(place)} live LRU entries, {entries} in segments")
