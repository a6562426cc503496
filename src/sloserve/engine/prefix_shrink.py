"""The prefix-caching KV manager's ``shrink`` and ``shrink_many`` (a cut run of decodes).

The engine cuts a fast-forwarded run of decodes short in one call
(:meth:`~sloserve.engine.kv.KVManager.shrink_many`). The paged manager does it inline,
but only when ``shrink`` is its own: the prefix manager's ``shrink`` adds a check, so it
would fall back to one method call (and one ``held_units`` call) per request. This is that
loop with the check and the plain shrink inlined: the same effects, the same error on the
same request, with the requests before it already shrunk (as the loop leaves them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sloserve.engine.kv import KVInvariantError, PagedKVManager

if TYPE_CHECKING:
    from sloserve.engine.prefix_cache import PrefixCachingKVManager


def prefix_shrink(kv: PrefixCachingKVManager, req_id: int, n_tokens: int) -> None:
    """:meth:`PrefixCachingKVManager.shrink`: the paged manager's, refusing to cut a unit
    the request holds."""
    # The engine cuts a fast-forwarded run before it retires: its tokens are past every
    # unit the request holds. Cutting into one would free blocks others may share.
    held = kv.held_units(req_id)
    if held and kv._tokens[req_id] - n_tokens < held * kv.unit_tokens:
        raise KVInvariantError(f"request {req_id}: shrinking would cut a cached unit")
    PagedKVManager.shrink(kv, req_id, n_tokens)


def prefix_shrink_many(kv: PrefixCachingKVManager, req_ids: Sequence[int], n_tokens: int) -> None:
    """:meth:`PrefixCachingKVManager.shrink` each request by ``n_tokens``, in order."""
    bs, ut = kv.block_size, kv.unit_tokens
    held, tokens, tables, free = kv._held, kv._tokens, kv._tables, kv._free
    for r in req_ids:
        t = tokens[r] - n_tokens
        chain = held.get(r)
        # Its tokens stay past every unit it holds: cutting into one would free shared blocks.
        if chain and t < chain[-1].holders[r] * ut:
            raise KVInvariantError(f"request {r}: shrinking would cut a cached unit")
        if t < 0:
            raise KVInvariantError(f"request {r}: cannot shrink by {n_tokens} tokens")
        table = tables[r]
        extra = len(table) - -(-t // bs)
        if extra > 0:
            free.extend(reversed(table[-extra:]))  # the plain shrink's order
            del table[-extra:]
        tokens[r] = t
