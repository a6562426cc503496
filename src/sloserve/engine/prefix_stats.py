"""Prefix-cache hit accounting for a run summary: totals and the hit rate over time per
replica, from the replicas' :class:`~sloserve.engine.prefix_cache.PrefixCachingKVManager`
hit logs."""

from __future__ import annotations

import math
from collections.abc import Sequence

from sloserve.engine.kv import KVCacheManager
from sloserve.engine.prefix_cache import PrefixCachingKVManager


def prefix_summary(
    kvs: Sequence[KVCacheManager], *, replicas: Sequence[int] | None = None, end: float = 0.0
) -> dict[str, object]:
    """Hit accounting over replicas' KV managers, for a run summary: whether prefix
    caching was on, prompt tokens looked up, tokens found (``prefill_tokens_saved``; on the
    CPU tier: ``prefix_hit_tokens_cpu``), the hit rate and the cached units evicted; when
    any prompt was looked up, the hit rate over time per replica
    (``prefix_hits_over_time``, :func:`hits_over_time`; ``replicas``: each manager's
    replica id, default 0; ``end``: the run's end)."""
    caches = [kv for kv in kvs if isinstance(kv, PrefixCachingKVManager)]
    looked = sum(kv.lookup_tokens for kv in caches)
    cpu = sum(kv.hit_tokens_cpu for kv in caches)
    hit = sum(kv.hit_tokens_gpu - kv.released_tokens for kv in caches) + cpu
    out: dict[str, object] = {
        "prefix_caching": bool(caches),
        "prefix_lookup_tokens": looked,
        "prefill_tokens_saved": hit,
        "prefix_hit_tokens_cpu": cpu,
        "prefix_hit_rate": hit / looked if looked else 0.0,
        "prefix_evicted_units": sum(kv.evicted_units for kv in caches),
    }
    if looked:
        ids = list(replicas) if replicas is not None else [0] * len(kvs)
        logs: dict[int, list[tuple[float, int, int]]] = {}
        for rid, kv in zip(ids, kvs, strict=True):
            if isinstance(kv, PrefixCachingKVManager):
                logs.setdefault(rid, []).extend(kv.hit_log)
        out["prefix_hits_over_time"] = hits_over_time(logs, end)
    return out


def _nice_bin(end: float, bins: int) -> float:
    """The smallest of 1, 2, 5 × 10^k seconds that splits ``end`` in at most ``bins``."""
    raw = max(end, 1e-9) / bins
    k = math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * 10.0**k >= raw:
            return m * 10.0**k
    return 10.0 ** (k + 1)  # pragma: no cover (m = 10 always suffices)


def hits_over_time(
    logs: dict[int, list[tuple[float, int, int]]], end: float, *, bins: int = 60
) -> dict[str, object]:
    """Per replica, prompt tokens looked up and found in the prefix cache per time bucket
    (about ``bins`` of them over ``[0, end]``, 1/2/5 × 10^k s wide), and the hit rate
    (found / looked up, None for a bucket with no lookup). A token is counted when it was
    found (a later retry's gain counts at the retry); hits a queued request released unused
    count negatively when released, as in the run's hit rate, and a bucket's rate is
    clipped to [0, 1]."""
    # (max of each log's triples: the largest time first, compared in C)
    last = max((max(log)[0] for log in logs.values() if log), default=0.0)
    width = _nice_bin(max(end, last), bins)
    n = int(max(end, last) // width) + 1
    series = []
    for rid in sorted(logs):
        looked, found = [0] * n, [0] * n
        for t, lk, h in logs[rid]:
            i = int(t // width)
            looked[i] += lk
            found[i] += h
        series.append(
            {
                "replica": rid,
                "lookup_tokens": looked,
                "hit_tokens": found,
                "hit_rate": [
                    min(1.0, max(0.0, f / lk)) if lk else None
                    for lk, f in zip(looked, found, strict=True)
                ],
            }
        )
    return {"bin_s": width, "t": [i * width for i in range(n)], "replicas": series}
