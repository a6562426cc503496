"""The prefix-caching KV manager's invariant check (kept apart from its hot paths).

:func:`check_prefix_cache` rebuilds, from the requests' tables and the units they hold,
what :class:`~sloserve.engine.prefix_cache.PrefixCachingKVManager` keeps incrementally —
each unit's holders, where its blocks are, the LRU order of the unreferenced ones — and
raises :class:`~sloserve.engine.kv.KVInvariantError` on the first difference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sloserve.engine.kv import KVInvariantError

if TYPE_CHECKING:
    from sloserve.engine.prefix_cache import PrefixCachingKVManager

_MASK = (1 << 20) - 1  # prefix_cache._MASK: holders, in a referenced unit's state


def check_prefix_cache(kv: PrefixCachingKVManager) -> dict[int, str]:
    """Check the cache's bookkeeping; the owner of every GPU block found (free, in a
    cached unit, private to a request), for the paged manager's accounting check."""
    u = kv.unit_blocks
    state = kv._state
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
    refs = dict.fromkeys(state, 0)
    for rid, table in kv._tables.items():
        held = kv._held.get(rid, [])
        if len(table) != kv._blocks_for(kv._tokens[rid]):
            tokens = kv._tokens[rid]
            raise KVInvariantError(f"request {rid}: {len(table)} blocks for {tokens} tokens")
        for i, key in enumerate(held):
            v = state.get(key, 0)
            if v <= 0:
                raise KVInvariantError(f"request {rid}: unit {i} ({key}) is not a held unit")
            blocks = tuple(table[i * u : (i + 1) * u])
            there = kv._orphans.get(key)
            if there is None:
                at, j = v >> 40, (v >> 20) & _MASK
                if at not in kv._tables:
                    raise KVInvariantError(f"cached unit {key}: its blocks are nowhere")
                there = tuple(kv._tables[at][j * u : (j + 1) * u])
            if len(blocks) != u or there != blocks:
                raise KVInvariantError(f"request {rid}: unit {i} is not cached unit {key}")
            if not refs[key]:  # a shared unit's blocks are owned once
                for b in blocks:
                    own(b, f"in cached unit {key}")
            refs[key] += 1
        for b in table[len(held) * u :]:
            own(b, f"private to request {rid}")
    if set(kv._held) - set(kv._tables):
        raise KVInvariantError("a request holds cached units but no blocks")
    lst, base = kv._lru_keys, kv._lru_base
    for key, n in refs.items():
        v = state[key]
        if n and (v & _MASK if v > 0 else 0) != n:
            raise KVInvariantError(f"cached unit {key}: state {v}, held {n}")
        if not n:
            if v >= 0:
                raise KVInvariantError(f"cached unit {key}: state {v}, held by nobody")
            at = ~v - base
            if not kv._lru_head <= at < len(lst) or lst[at] != key:
                raise KVInvariantError(f"cached unit {key}: not in the LRU list at {~v}")
    if kv._cached != sum(1 for n in refs.values() if n == 0):
        raise KVInvariantError(f"{kv._cached} unreferenced cached units counted")
    if any(state[key] < 0 for key in kv._orphans):
        raise KVInvariantError("an unreferenced cached unit keeps blocks of its own")
    if len(kv._host) > kv.cpu_cache_units:
        raise KVInvariantError(f"CPU cache holds {len(kv._host)} units, over capacity")
    return owner
