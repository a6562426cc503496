"""The prefix cache's CPU tier (host memory for evicted cached units, LMCache style): a
lookup's hits there, copied back into fresh GPU blocks.

Kept apart from :class:`~sloserve.engine.prefix_cache.PrefixCachingKVManager`'s GPU
bookkeeping; it reads and changes that manager's state as one of its methods would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sloserve.engine.prefix_segments import Segment

if TYPE_CHECKING:
    from sloserve.engine.prefix_cache import PrefixCachingKVManager


def take_from_host(
    kv: PrefixCachingKVManager,
    rid: int,
    keys: tuple[int, ...],
    p: int,
    most: int,
    chain: list[Segment],
    table: list[int],
) -> int:
    """Request ``rid`` holds its prompt's units up to ``p`` on the GPU: take the units from
    ``p`` on (below ``most``) that the CPU tier holds, in order, each into ``u`` fresh
    blocks appended to ``table``, as a segment of its own appended to ``chain`` (it
    registers its computed units there next). Returns where its prefix now ends."""
    host, free, u = kv._host, kv._free, kv.unit_blocks
    own: Segment | None = None
    for key in keys[p:most]:
        # Room for the copy without evicting what this request holds or needs.
        if key not in host or len(free) < u:
            break
        del host[key]  # out while making room, so that room is not made with it
        kv._reclaim(u)
        host[key] = None  # the host copy stays (newest), as LMCache keeps it
        if len(host) > kv.cpu_cache_units:
            host.popitem(last=False)
        if own is None:  # the index holds a segment's first unit
            own = Segment(keys, p, rid)
            chain.append(own)
            kv._starts[key] = own
        p += 1
        own.end = own.top = own.holders[rid] = p
        table.extend(free[-u:])
        del free[-u:]
    return p
