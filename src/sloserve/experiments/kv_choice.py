"""Which KV manager a simulated replica gets, and what the summary says about caching.

Prefix caching is on by default (vLLM's APC). When no request of a run carries a prompt
identity (:func:`sloserve.workloads.identity.carries_prefix_identity`: e.g. the Azure
conversation trace, which has none) nothing can ever hit, and the caching manager would
only add its bookkeeping to every KV call (issue 14 measured 0.1–0.2 s of a 2–3.5 s
16,384-request run). Such a replica gets the plain paged manager instead; its decisions are
the caching manager's (with nothing cached, both count the same free blocks; a request
without identity blocks never looks up, registers or holds a cached unit), which
``tests/test_kv_choice.py`` checks run against run.

The summary stays truthful: ``prefix_caching`` reports what the run asked for (on, unless
``--no-prefix-caching`` or a policy with its own manager), and the lookups, hits and
evictions are 0, as they are with the caching manager on such a workload.
"""

from __future__ import annotations

from collections.abc import Sequence

from sloserve.engine.kv import KVCacheManager, PagedKVManager
from sloserve.engine.prefix_cache import PrefixCachingKVManager


def replica_kv(
    own: KVCacheManager | None,
    *,
    caching: bool,
    prefix_identities: bool,
    num_blocks: int,
    block_size: int,
    cpu_blocks: int,
    cpu_cache_blocks: int,
) -> KVCacheManager:
    """The KV manager of one replica: the policy's ``own`` one if it has one (BROS);
    else the prefix-caching manager when ``caching`` is asked for and a request may carry
    a prompt identity (``prefix_identities``), else the plain paged manager."""
    if own is not None:
        return own
    if caching and prefix_identities:
        return PrefixCachingKVManager(
            num_blocks, block_size, cpu_blocks, cpu_cache_blocks=cpu_cache_blocks
        )
    return PagedKVManager(num_blocks, block_size, cpu_blocks)


def caching_asked(kvs: Sequence[KVCacheManager], caching: Sequence[bool]) -> bool:
    """The summary's ``prefix_caching``: any replica runs the caching manager, or stands in
    for it with the plain one (``caching`` asked for, per replica, and the manager is the
    plain paged one, not a policy's own)."""
    return any(
        isinstance(kv, PrefixCachingKVManager) or (want and type(kv) is PagedKVManager)
        for kv, want in zip(kvs, caching, strict=True)
    )
