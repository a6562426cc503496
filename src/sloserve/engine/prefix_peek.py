"""A router's peek at many replicas' prefix caches at once: one call a routing decision.

A cache-aware router asks every candidate replica how much of a prompt's prefix it holds
(``cluster/prefix_routing.py``): on 16 replicas of the Mooncake trace, 192,496 questions
a run. Asked one replica at a time (:meth:`PrefixCachingKVManager.peek_prefix` through
each replica's view), each question paid the view's and the manager's calls and the
prompt's key lookup again; :func:`peek_many` answers them all in one loop: the prompt's
unit keys once per cache-unit size, then per replica one probe of its segment index
(``engine/prefix_segments.py``: a chain enters a segment only at its start) and, on a
hit, the segment walk. The answers are :meth:`~PrefixCachingKVManager.peek_prefix`'s,
replica by replica (a test compares them); a manager of another kind is asked itself.

It reads the caching manager's index and CPU tier directly (this package's own
bookkeeping, read-only): the point is to make no call per replica.
"""

from __future__ import annotations

from collections.abc import Sequence

from sloserve.engine.kv import KVCacheManager
from sloserve.engine.prefix_cache import PrefixCachingKVManager
from sloserve.engine.prefix_keys import unit_keys
from sloserve.engine.prefix_segments import agree_until

__all__ = ["peek_many"]


def peek_many(
    kvs: Sequence[KVCacheManager | None], hash_ids: tuple[int, ...], prompt_tokens: int
) -> list[int]:
    """Tokens of the prompt's prefix cached in each manager (GPU and CPU tiers), in order;
    0 for None (no engine). The same answers as asking each manager's ``peek_prefix``."""
    out: list[int] = []
    keys: tuple[int, ...] = ()
    shape = (0, 0)  # (unit tokens, source tokens) the keys were computed for
    for kv in kvs:
        if kv is None:
            out.append(0)
            continue
        if type(kv) is not PrefixCachingKVManager:  # the plain manager (0), or another kind
            out.append(kv.peek_prefix(hash_ids, prompt_tokens))
            continue
        unit = kv.unit_tokens
        if shape[0] != unit or shape[1] != kv.source_block_tokens:  # (once, in practice)
            shape = (unit, kv.source_block_tokens)
            keys = unit_keys(hash_ids, prompt_tokens, unit, shape[1])
        if not keys:
            out.append(0)
            continue
        # prefix_segments.cached_until, inlined (one call fewer a replica, ~120,000 a
        # Mooncake run): segment by segment, a chain going on only at a segment's start.
        starts, n, p = kv._starts, len(keys), 0
        seg = starts.get(keys[0])
        while seg is not None:
            lim = n if n < seg.end else seg.end
            if seg.keys[lim - 1] != keys[lim - 1]:  # the chains part inside it
                lim = agree_until(keys, seg.keys, p, lim)
            p = lim
            seg = starts.get(keys[p]) if p < n else None
        host = kv._host
        if host:  # then the CPU tier, a unit at a time (GPU units are prefix-closed)
            while p < n and keys[p] in host:
                p += 1
        out.append(p * unit)
    return out
