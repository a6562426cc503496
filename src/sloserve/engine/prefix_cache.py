"""Automatic prefix caching in the paged KV manager, with a host-memory (CPU) tier.

vLLM's automatic prefix caching, on sloserve's prompt identity: a request's prompt carries
block ids (:attr:`Request.hash_ids`, Mooncake's ``hash_ids``: one id per
``source_block_tokens`` = 512 tokens, equal ids meaning an identical prefix block).

**Cache units and the block-size mapping.** The engine's KV block (``block_size``, 16 by
default) rarely equals the trace's 512 tokens, and an identity is only known per trace
block. Caching therefore works in *units* of ``u = max(1, 512 // block_size)`` engine
blocks (``U = u · block_size`` tokens: exactly one trace block for 16, 32, 64, 128, 256 and
512; one engine block of 1,024 tokens covering two trace blocks for ``block_size`` 1024).
Unit ``i`` covers tokens ``[i·U, (i+1)·U)``; its key hashes the chained hash of every trace
block up to the one holding its last token, with the unit's end: equal keys mean an
identical prefix. When ``block_size`` does not divide 512 the key is stricter than
needed (it includes the whole last trace block) and some hits are missed, never a false
one. Keys are Python's integer/tuple hashes (deterministic: no hash randomisation for
ints), 64 bits wide.

**Lifecycle** (vLLM's, at unit grain — the choice that keeps the bookkeeping O(units of
the prompt), about 24 per Mooncake request instead of 750 blocks):

- A request that arrives on a replica looks its prefix up at the replica's next decision
  (:func:`refresh_queued`; a recompute-preempted one when it is requeued):
  :meth:`PrefixCachingKVManager.lookup_prefix` walks its keys and takes a reference on the
  longest chain of cached units (on the GPU, then in the CPU tier, whose units are copied
  back into fresh GPU blocks and priced as a transfer by the cost model's ``swap_time`` in
  the iteration that admits the request). The request then *holds* those blocks while it
  waits, and its ``num_computed_tokens`` starts there (the instance sets it; the state
  machine does not change). At least one prompt token is always left to compute (the
  last one must run to emit a token), as vLLM does. The oldest queued requests
  (:data:`REFRESH_HEAD`) retry when the cache has grown, after a request arrived or ended:
  a turn queued behind the one computing its prefix still reuses it.
- A full unit of a prompt is registered in the cache when an iteration that computed it
  ends (``retired``; vLLM registers at allocation, one iteration earlier: registering at
  the end keeps a fast-forwarded run and single steps identical). A unit whose key is
  already cached (two requests computing the same prefix at once) stays private, and so
  does the rest of that request's prompt.
- Freeing a request drops its references; a unit nobody references stays cached and joins
  the LRU list (tail units first, so that a prompt's tail is evicted before its head). It
  is evicted, whole, only when the allocator needs blocks; with a CPU tier its key then
  moves to host memory (bounded, LRU), from which a later hit is a transfer instead of a
  recompute.
- ``num_free_blocks`` counts free blocks plus cached units nobody references: a policy sees
  cached memory as free, so with no prefix shared every decision is the one it would take
  without caching. ``num_request_blocks`` (what preempting a request frees) counts only
  the blocks it alone holds.
- Bookkeeping (what caching costs in run time: on the full Mooncake conversation trace
  ~280k units registered and ~245k evicted): one int per cached unit (its holders and
  where its blocks are, or its place in the LRU list); an unreferenced unit's blocks lie
  anonymous on the free list, so evicting it moves no block id; the LRU list is
  append-only, a unit hit again leaving a stale entry that eviction skips.

A waiting request holding cached blocks could keep a replica from running anything (its
blocks are what the running ones need): when a policy schedules no batch, the queued
requests release their prefixes (:func:`release_queued_prefixes`) and the instance asks
the policy again.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sloserve.core.request import Request, RequestStatus
from sloserve.engine.interface import SchedulerOutput
from sloserve.engine.kv import KVInvariantError, PagedKVManager

if TYPE_CHECKING:
    from sloserve.engine.instance import Instance

SOURCE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in Mooncake's traces (the prompt identity's grain)."""

_MIX = 0x9E3779B97F4A7C15

_ONE = 1 << 20
"""A referenced unit's state (constructor): holders in the low 20 bits, then its position
in the table that locates it (20 bits), then that request's id."""
_MASK = _ONE - 1
_COMPACT = 4096  # LRU list entries consumed before the list drops them


@functools.lru_cache(maxsize=256)  # a router asks for every replica of one decision
def unit_keys(
    hash_ids: tuple[int, ...], prompt_tokens: int, unit_tokens: int, source_tokens: int
) -> tuple[int, ...]:
    """Keys of the full cache units of a prompt (module docstring): unit ``i`` is keyed by
    the chained hash of the trace blocks up to the one holding its last token, and its
    end. Only units inside the prompt and covered by ``hash_ids`` have a key."""
    covered = min(prompt_tokens, len(hash_ids) * source_tokens)
    n = covered // unit_tokens
    if n == 0:
        return ()
    prefix: list[int] = []  # the chained hash of each trace block
    h = 0
    for block in hash_ids[: ((n * unit_tokens) - 1) // source_tokens + 1]:
        h = hash((h, block))
        prefix.append(h)
    ends = range(unit_tokens, n * unit_tokens + 1, unit_tokens)
    if unit_tokens == source_tokens:  # unit i is trace block i: the same keys, hashed in C
        return tuple(map(hash, zip(prefix, ends, strict=True)))
    return tuple(hash((prefix[(end - 1) // source_tokens], end)) for end in ends)


class PrefixCachingKVManager(PagedKVManager):
    """The paged manager with automatic prefix caching and a CPU tier for cached units.

    ``cpu_blocks`` is the swap tier for preempted requests (as the plain manager's);
    ``cpu_cache_blocks`` is host memory for evicted cached units (0: no CPU cache tier).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        cpu_blocks: int = 0,
        *,
        cpu_cache_blocks: int = 0,
        source_block_tokens: int = SOURCE_BLOCK_TOKENS,
    ) -> None:
        super().__init__(num_blocks, block_size, cpu_blocks)
        if cpu_cache_blocks < 0:
            raise ValueError("CPU cache capacity must be >= 0 blocks")
        self.unit_blocks = max(1, source_block_tokens // block_size)
        self.unit_tokens = self.unit_blocks * block_size
        self.source_block_tokens = source_block_tokens
        self.cpu_cache_units = cpu_cache_blocks // self.unit_blocks
        # Cached units: one int per key in ``_state`` (one dictionary operation per unit
        # registered, released or evicted — the cost of caching is these operations).
        # - Referenced (> 0): holders + _ONE * (position + _ONE * request): its blocks are
        #   where that request's table has that unit (the holders share them), or, once that
        #   request freed its table while others hold the unit, in ``_orphans``.
        # - Unreferenced (< 0): ``~stamp``, its place in the LRU list ``_lru_keys``
        #   (absolute: ``_lru_base`` is the stamp of the list's first entry). A unit hit
        #   again leaves a stale entry there (its state no longer names that stamp), which
        #   eviction skips, so the list is the LRU order of the unreferenced units.
        #   Its blocks are *anonymous*: they lie on the free list, which then holds
        #   ``unit_blocks * _cached`` blocks more than the truly free ones (``_spare``).
        #   Which block ids a unit has never changes a result, only how many: eviction then
        #   moves no block id and release returns a table as the plain manager does.
        self._state: dict[int, int] = {}
        self._orphans: dict[int, tuple[int, ...]] = {}
        self._lru_keys: list[int] = []
        self._lru_head = 0  # the list's first entry eviction has not consumed
        self._lru_base = 0
        self._cached = 0  # unreferenced cached units
        self._host: OrderedDict[int, None] = OrderedDict()  # keys in the CPU tier, LRU
        self._keys: dict[int, tuple[int, ...]] = {}  # request -> keys of its prompt's units
        self._held: dict[int, list[int]] = {}  # request -> keys it references (a prefix)
        self._open: set[int] = set()  # requests that still register their new units
        self._transfer = 0
        # CPU-tier hits are priced in the iteration that admits their request (the copy
        # overlaps nothing before it), so that single steps and fast runs price them alike.
        self._copying: dict[int, int] = {}
        self.registered = 0  # units ever registered: a queued request retries when it grows
        self._refreshed_at = 0  # ``registered`` at the last refresh of queued requests
        self._ended_seen = 0  # requests ended on the instance at the last refresh
        self.arrived: list[Request] = []  # queued since the last decision: to look up
        # Hit accounting (per replica): prompt tokens looked up, hits on GPU / CPU, and one
        # (time, tokens looked up, hit tokens) triple per lookup (a release of hits never
        # used: negative hit tokens) for the hit rate over time; ``now`` is the time the
        # instance last looked up at.
        self.lookup_tokens = 0
        self.hit_tokens_gpu = 0
        self.hit_tokens_cpu = 0
        self.evicted_units = 0
        self.released_tokens = 0
        self.hit_log: list[tuple[float, int, int]] = []
        self.now = 0.0

    # ------------------------------------------------------------------ capacity
    # ``num_free_blocks`` (the plain manager's: the free list's length) counts the truly
    # free blocks and the unreferenced cached units' (constructor); so does the plain
    # manager's ``max_uniform_growth``.
    @property
    def num_cached_blocks(self) -> int:
        """Blocks of cached units nobody references (evictable; on the free list)."""
        return self._cached * self.unit_blocks

    @property
    def _spare(self) -> int:
        """Blocks on the free list that no cached unit stands for (truly free)."""
        return len(self._free) - self._cached * self.unit_blocks

    def reference_counts(self) -> dict[int, int]:
        """Holders of every cached unit, by key (0: cached, unreferenced)."""
        return {key: v & _MASK if v > 0 else 0 for key, v in self._state.items()}

    def _reclaim(self, need: int) -> None:
        """Evict LRU cached units until ``need`` blocks are truly free (or none is left to
        evict). Their blocks are on the free list already: only the keys go."""
        # Whole units, oldest first: as many as the shortfall needs (one pass, no re-test).
        n = min(self._cached, -(-(need - self._spare) // self.unit_blocks))
        if n <= 0:
            return
        self.evicted_units += n
        self._cached -= n
        host = self._host if self.cpu_cache_units else None
        state, lst, i, base = self._state, self._lru_keys, self._lru_head, self._lru_base
        while n:
            key = lst[i]
            if state.get(key) == ~(base + i):  # else: a stale entry (the unit was hit)
                del state[key]
                n -= 1
                if host is not None:
                    host[key] = None
                    host.move_to_end(key)
                    if len(host) > self.cpu_cache_units:
                        host.popitem(last=False)
            i += 1
        if i > _COMPACT and 2 * i > len(lst):
            del lst[:i]
            self._lru_base += i
            i = 0
        self._lru_head = i

    def _renumber_lru(self) -> None:
        """Drop the LRU list's stale entries (units hit since), keeping its order: without
        evictions to consume them, hits and releases would grow it without bound."""
        state, lst, i = self._state, self._lru_keys, self._lru_head
        stamp = self._lru_base + len(lst)  # fresh stamps: no stale entry can match them
        live = [k for j, k in enumerate(lst[i:], self._lru_base + i) if state.get(k) == ~j]
        for j, key in enumerate(live, stamp):
            state[key] = ~j
        self._lru_keys, self._lru_head, self._lru_base = live, 0, stamp

    # ------------------------------------------------------------------ prefix reuse
    def lookup_prefix(self, req: Request) -> int:
        if req.hash_ids is None:
            return 0
        rid = req.req_id
        keys = self._keys.get(rid)
        if keys is None:
            keys = self._keys[rid] = unit_keys(
                req.hash_ids, req.num_prompt_tokens, self.unit_tokens, self.source_block_tokens
            )
        held = self._held.get(rid, [])
        start = len(held)
        if rid in self._swapped or self._tokens.get(rid, 0) != start * self.unit_tokens:
            raise KVInvariantError(f"request {rid} looked up its prefix while holding KV")
        # Leave at least one prompt token to compute: it emits the next token.
        most = min(len(keys), (req.num_prompt_tokens - 1) // self.unit_tokens)
        state, free = self._state, self._free
        table = self._tables.get(rid, [])
        held = list(held)
        u = self.unit_blocks
        me = rid * _ONE
        for key in keys[start:most]:
            v = state.get(key)
            if v is None:
                break
            if v > 0:  # its blocks are where a holder has them
                orphan = self._orphans.get(key)
                if orphan is None:
                    i = (v >> 20) & _MASK
                    table.extend(self._tables[v >> 40][i * u : (i + 1) * u])
                else:
                    table.extend(orphan)
                state[key] = v + 1
            else:  # anonymous on the free list: any of them will do (constructor)
                self._cached -= 1  # its LRU entry is stale now
                state[key] = 1 + _ONE * (len(held) + me)
                table.extend(free[-u:])
                del free[-u:]
            held.append(key)
        gpu = len(held)
        if self._host and gpu < most:
            host = self._host
            for key in keys[gpu:most]:
                # Room for the copy without evicting what this request holds or needs.
                if key not in host or len(free) < u:
                    break
                del host[key]  # out while making room, so that room is not made with it
                self._reclaim(u)
                host[key] = None  # the host copy stays (newest), as LMCache keeps it
                if len(host) > self.cpu_cache_units:
                    host.popitem(last=False)
                state[key] = 1 + _ONE * (len(held) + me)
                held.append(key)
                table.extend(free[-u:])
                del free[-u:]
        cpu = len(held) - gpu
        gained = (len(held) - start) * self.unit_tokens
        looked = 0 if start else req.num_prompt_tokens  # a refresh looks up nothing new
        self.lookup_tokens += looked
        self.hit_tokens_gpu += (gpu - start) * self.unit_tokens
        self.hit_tokens_cpu += cpu * self.unit_tokens
        if cpu:
            self._copying[rid] = self._copying.get(rid, 0) + cpu * self.unit_tokens
        if looked or gained:
            self.hit_log.append((self.now, looked, gained))
        self._open.add(rid)
        if held:
            self._held[rid] = held
            self._tables[rid] = table
            self._tokens[rid] = len(held) * self.unit_tokens
        return gained

    def peek_prefix(self, hash_ids: Sequence[int], prompt_tokens: int) -> int:
        keys = unit_keys(tuple(hash_ids), prompt_tokens, self.unit_tokens, self.source_block_tokens)
        state, host = self._state, self._host
        n = 0
        for key in keys:
            if key not in state and key not in host:
                break
            n += 1
        return n * self.unit_tokens

    def take_transfer_tokens(self) -> int:
        moved, self._transfer = self._transfer, 0
        return moved

    def retired(self, batch: Sequence[tuple[Request, int]]) -> None:
        """An iteration (or fast-forwarded run) of ``batch`` ended: cache the prompt units
        its requests have now computed. Called only while :attr:`registering`."""
        open_ = self._open
        for r, _n in batch:
            if r.req_id in open_:
                self._register(r.req_id, r.num_computed_tokens)

    @property
    def registering(self) -> bool:
        """Some request still has prompt units to cache when it computes them."""
        return bool(self._open)

    def _register(self, rid: int, tokens: int) -> None:
        """Cache the request's prompt units that ``tokens`` of KV now cover."""
        keys = self._keys.get(rid)
        if not keys:
            self._open.discard(rid)
            return
        held = self._held.get(rid)
        k = len(held) if held is not None else 0
        full = min(len(keys), tokens // self.unit_tokens)
        if full <= k:
            return
        if held is None:
            held = self._held[rid] = []
        state = self._state
        me = rid * _ONE
        for i in range(k, full):
            key = keys[i]
            if key in state:  # computed by another request too: ours stays private
                self._open.discard(rid)
                break
            state[key] = 1 + _ONE * (i + me)
            held.append(key)
        else:
            if full == len(keys):
                self._open.discard(rid)
        self.registered += len(held) - k

    # ------------------------------------------------------------------ allocation
    def allocate(self, req_id: int, n_new_tokens: int) -> list[int] | None:
        if self._cached:
            table = self._tables.get(req_id)
            need = -(-(self._tokens.get(req_id, 0) + n_new_tokens) // self.block_size) - (
                len(table) if table is not None else 0
            )
            if need > len(self._free) - self._cached * self.unit_blocks:  # truly free
                if need > len(self._free):
                    return None
                self._reclaim(need)
        new = super().allocate(req_id, n_new_tokens)
        if new is not None and self._copying and req_id in self._copying:
            self._transfer += self._copying.pop(req_id)
        return new

    def grow_many(self, req_ids: Sequence[int], n_new_tokens: int) -> bool:
        # Decodes grow past the prompt: nothing to register, only room to make.
        cached = self._cached
        if cached and len(self._free) - cached * self.unit_blocks < len(req_ids) * (
            n_new_tokens // self.block_size + 1
        ):
            need = sum(self.blocks_needed(r, n_new_tokens) for r in req_ids)
            if need > len(self._free):
                return False
            self._reclaim(need)
        return super().grow_many(req_ids, n_new_tokens)

    def free(self, req_id: int) -> int:
        self._copying.pop(req_id, None)  # released before it ran: no copy was needed
        held = self._held.pop(req_id, None)
        self._open.discard(req_id)
        if not held:
            return super().free(req_id)
        table = self._tables.pop(req_id)
        self._tokens.pop(req_id, None)
        state, free, lst = self._state, self._free, self._lru_keys
        first = stamp = self._lru_base + len(lst)
        for key in reversed(held):  # the tail is evicted first
            v = state[key] - 1
            if v < 0:
                raise KVInvariantError(f"cached unit {key} released while unreferenced")
            if v & _MASK:
                state[key] = v
            else:  # unreferenced: the newest in the LRU list
                state[key] = ~stamp
                lst.append(key)
                stamp += 1
        released = stamp - first
        self._cached += released
        if len(lst) - self._lru_head > 2 * self._cached + _COMPACT:  # mostly stale entries
            self._renumber_lru()
        orphans = self._orphans
        if orphans:  # an unreferenced unit keeps no blocks of its own
            for key in held:
                if state[key] < 0:
                    orphans.pop(key, None)
        if released == len(held):  # the usual case: it alone held them
            free.extend(table)  # every block, the units' anonymous (constructor)
            return len(table)
        u = self.unit_blocks
        for i, key in enumerate(held):
            v = state[key]
            if v < 0:  # its blocks join the free list, anonymous
                free.extend(table[i * u : (i + 1) * u])
            elif v >> 40 == req_id and key not in orphans:  # the others keep them
                orphans[key] = tuple(table[i * u : (i + 1) * u])
        free.extend(table[len(held) * u :])
        return len(table)

    def shrink(self, req_id: int, n_tokens: int) -> None:
        # The engine cuts a fast-forwarded run before it retires: its tokens are past every
        # unit the request holds. Cutting into one would free blocks others may share.
        held = self._held.get(req_id)
        if held and self._tokens[req_id] - n_tokens < len(held) * self.unit_tokens:
            raise KVInvariantError(f"request {req_id}: shrinking would cut a cached unit")
        super().shrink(req_id, n_tokens)

    def forget(self, req_id: int) -> None:
        self._keys.pop(req_id, None)

    # A request's shared units stay on the GPU for the others: preempting it frees (and
    # swapping it out moves to the CPU) only the blocks it alone holds; swapping it back
    # in allocates all its blocks afresh (private).
    def num_request_blocks(self, req_id: int) -> int:
        table = self._tables.get(req_id)
        if table is None:
            return 0
        held = self._held.get(req_id)
        if not held:
            return len(table)
        state = self._state
        return len(table) - self.unit_blocks * sum(1 for key in held if state[key] & _MASK > 1)

    def blocks_needed(self, req_id: int, n_new_tokens: int) -> int:
        table = self._tables.get(req_id)
        have = len(table) if table is not None else 0
        need = -(-(self._tokens.get(req_id, 0) + n_new_tokens) // self.block_size) - have
        return need if need > 0 else 0

    def swap_in_blocks_needed(self, req_id: int) -> int:
        return self._blocks_for(self._swapped[req_id][0])

    def swap_in(self, req_id: int) -> int | None:
        tokens, blocks = self._swapped[req_id]
        need = self._blocks_for(tokens)
        if need > len(self._free):
            return None
        self._reclaim(need)
        del self._swapped[req_id]
        self.cpu.used_blocks -= blocks
        if super().allocate(req_id, tokens) is None:
            raise KVInvariantError(f"request {req_id}: swap-in did not fit after reclaiming")
        return tokens

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        from sloserve.engine.prefix_checks import check_prefix_cache

        self._check_accounting(check_prefix_cache(self))


_QUEUED = (RequestStatus.WAITING, RequestStatus.PREEMPTED_RECOMPUTE)


def queue_lookup(inst: Instance, req: Request) -> None:
    """``req`` arrived at ``inst``: it looks its prefix up at the next decision (when the
    iterations before it have retired, in single steps and fast runs alike)."""
    kv = inst.kv
    if req.hash_ids is not None and isinstance(kv, PrefixCachingKVManager):
        kv.arrived.append(req)


def reuse_prefix(inst: Instance, req: Request) -> None:
    """``req`` is queued on ``inst`` with no KV: reuse its cached prefix, if any."""
    kv = inst.kv
    if isinstance(kv, PrefixCachingKVManager):
        kv.now = inst.env.now
    hit = kv.lookup_prefix(req)
    if hit:
        req.num_computed_tokens = hit
        req.num_cached_tokens = hit


REFRESH_HEAD = 8
"""Queued requests (the oldest) that retry their lookup when the cache grew (module
docstring)."""


def refresh_queued(inst: Instance) -> None:
    """Extend the cached prefix of the oldest queued requests with units registered since
    they looked up (a request queued behind the one computing its prefix then reuses it,
    as vLLM's lookup at scheduling time does). Runs before a decision; arrivals look up
    here. The queued retry only after a request arrived or ended here and the cache grew
    since the last retry: both stop a fast-forwarded run, so single steps and fast runs
    retry at the same decisions."""
    kv = inst.kv
    if not isinstance(kv, PrefixCachingKVManager):
        return
    kv.now = inst.env.now
    arrived = bool(kv.arrived)
    if arrived:
        me = inst.instance_id
        for r in kv.arrived:  # still queued here, holding nothing (not aborted, not moved)
            if r.status in _QUEUED and r.instance_id == me and not r.num_computed_tokens:
                reuse_prefix(inst, r)
        kv.arrived.clear()
    # Only arrivals and ends trigger a retry: both stop a fast-forwarded run (a preemption
    # or a release inside a decision does not, and would retry at different decisions).
    if not arrived and len(inst.done) == kv._ended_seen:
        return
    kv._ended_seen = len(inst.done)
    if kv.registered == kv._refreshed_at:
        return
    kv._refreshed_at = kv.registered
    for r in inst.waiting[:REFRESH_HEAD]:
        if r.hash_ids is not None and r.status in _QUEUED:
            gained = kv.lookup_prefix(r)
            r.num_computed_tokens += gained
            r.num_cached_tokens += gained


def _release(inst: Instance, kv: PrefixCachingKVManager) -> bool:
    """Queued requests give back the cached blocks they hold; True when any did."""
    released = False
    for r in reversed(inst.waiting):
        if r.status in _QUEUED and r.num_computed_tokens:
            kv.released_tokens += r.num_computed_tokens  # found, but never used
            kv.hit_log.append((inst.env.now, 0, -r.num_computed_tokens))
            kv.free(r.req_id)
            r.num_computed_tokens = 0
            r.num_cached_tokens = 0
            released = True
    return released


def unblock(inst: Instance, out: SchedulerOutput) -> SchedulerOutput:
    """``out`` as the policy decided, or, when it has no batch and queued requests held
    cached blocks (now released, :func:`release_queued_prefixes`), the policy's new one."""
    if out.batch or not release_queued_prefixes(inst, out):
        return out
    return inst.scheduler.schedule(inst.view)


def release_queued_prefixes(inst: Instance, out: SchedulerOutput) -> bool:
    """The policy scheduled no batch (nothing, or only evictions): the blocks queued
    requests hold may be what is missing (module docstring). They give them back and the
    instance asks its policy again; True when any was released."""
    kv = inst.kv
    if out.batch or not isinstance(kv, PrefixCachingKVManager):
        return False
    return _release(inst, kv)
