"""Automatic prefix caching in the paged KV manager, with a host-memory (CPU) tier.

vLLM's automatic prefix caching, on sloserve's prompt identity: a request's prompt carries
block ids (:attr:`Request.hash_ids`, Mooncake's ``hash_ids``: one id per
``source_block_tokens`` = 512 tokens, equal ids meaning an identical prefix block).

**Cache units and the block-size mapping.** The engine's KV block (``block_size``, 16 by
default) rarely equals the trace's 512 tokens, and an identity is only known per trace
block. Caching therefore works in *units* of ``u = max(1, 512 // block_size)`` engine
blocks (``U = u · block_size`` tokens: exactly one trace block for 16, 32, 64, 128, 256 and
512; one engine block of 1,024 tokens covering two trace blocks for ``block_size`` 1024).
Unit ``i`` covers tokens ``[i·U, (i+1)·U)``; its key names its whole prefix
(:mod:`~sloserve.engine.prefix_keys`). When ``block_size`` does not divide 512 the key is
stricter than needed and some hits are missed, never a false one.

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
- Bookkeeping (~280k units registered and ~245k evicted on the full Mooncake trace, in
  ~25k registrations, ~23k evictions and 12k releases): one entry per *chain segment*,
  the run of units one request registered, nothing per unit (engine/prefix_segments.py).
  An unreferenced unit's blocks lie anonymous on the free list: evicting moves no block.

A waiting request holding cached blocks could keep a replica from running anything (its
blocks are what the running ones need): when a policy schedules no batch, the queued
requests release their prefixes (:func:`release_queued_prefixes`) and the instance asks
the policy again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sloserve.core.request import Request, RequestStatus
from sloserve.engine import kv_kernels
from sloserve.engine.kv import KVInvariantError, PagedKVManager
from sloserve.engine.prefix_host import take_from_host
from sloserve.engine.prefix_keys import prompt_keys, unit_keys
from sloserve.engine.prefix_release import release_queued_prefixes as release_queued_prefixes
from sloserve.engine.prefix_release import unblock as unblock
from sloserve.engine.prefix_segments import (
    LRUEntry,
    Segment,
    agree_until,
    cached_until,
    evict,
    new_top,
    shared_units,
    trim_lru,
)
from sloserve.engine.prefix_shrink import prefix_shrink, prefix_shrink_many

if TYPE_CHECKING:
    from sloserve.engine.instance import Instance

SOURCE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in Mooncake's traces (the prompt identity's grain)."""

_COMPACT = 4096  # dead LRU list entries (hits took their units) before a release drops them
_CONSUMED = 64
"""LRU list entries eviction consumed before the list drops them (once they are half of
it: amortised, one pointer moved per entry). Soon, because a consumed entry keeps its
segment alive, and a segment evicted whole its keys and entry list: with 4,096 a
Mooncake run kept ~17,000 entries and ~10,000 dead segments until it ended, objects the
collector tracks (its young passes 119 against 38 with caching off)."""


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
        # Cached units, kept per chain segment (engine/prefix_segments.py): the index maps
        # each live segment's *first* unit's key to it (nothing per unit: a chain enters a
        # segment only at its start, engine/prefix_segments.py); holders, reference
        # counts, where blocks are and the LRU order are per segment too. An unreferenced
        # unit's blocks are *anonymous*: they lie on the free list, which then holds
        # ``unit_blocks * _cached`` blocks more than the truly free ones (``_spare``).
        # Which block ids a unit has never changes a result, only how many: eviction then
        # moves no block id and release returns a table as the plain manager does.
        self._starts: dict[int, Segment] = {}
        self._held: dict[int, list[Segment]] = {}  # request -> the segments of its prefix
        self._lru: list[LRUEntry] = []  # oldest first; dead entries skipped
        self._lru_head = 0  # the list's first entry eviction has not consumed
        self._cached = 0  # unreferenced cached units
        self._host: OrderedDict[int, None] = OrderedDict()  # keys in the CPU tier, LRU
        self._keys: dict[int, tuple[int, ...]] = {}  # request -> keys of its prompt's units
        # Requests that still register their new units -> the computed tokens at which
        # their next unit is complete (retiring a batch skips the others at one test).
        self._open: dict[int, int] = {}
        if not isinstance(getattr(type(self), "registering", None), property):
            self.registering = self._open  # (the base class's attribute: the same dict)
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
        # The log is kept flat, three numbers an entry (:attr:`hit_log` gives the triples):
        # a tuple an entry was ~15,000 objects a Mooncake run for the collector to track
        # and walk, numbers are none.
        self._hits: list[float] = []
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

    @property
    def hit_log(self) -> list[tuple[float, int, int]]:
        """One (time, tokens looked up, hit tokens) triple per lookup, in order (a release
        of hits never used: negative hit tokens), for the hit rate over time. A fresh,
        read-only copy built on each read (the log is kept flat)."""
        h = self._hits
        return list(zip(h[0::3], map(int, h[1::3]), map(int, h[2::3]), strict=True))

    def held_units(self, req_id: int) -> int:
        """Cached units the request holds (its prefix: units ``0 .. n-1``)."""
        held = self._held.get(req_id)
        return held[-1].holders[req_id] if held else 0

    def reference_counts(self) -> dict[int, int]:
        """Holders of every cached unit, by key (0: cached, unreferenced)."""
        from sloserve.engine.prefix_checks import reference_counts

        return reference_counts(self)

    def _reclaim(self, need: int) -> None:
        """Evict LRU cached units until ``need`` blocks are truly free (or none is left to
        evict). Their blocks are on the free list already: only segments' ends move (and a
        segment left empty leaves the index)."""
        # Whole units, oldest first: as many as the shortfall needs (one pass, no re-test).
        u, cached = self.unit_blocks, self._cached
        n = -(-(need - len(self._free) + cached * u) // u)
        if n > cached:
            n = cached
        if n <= 0:
            return
        self.evicted_units += n
        self._cached = cached - n
        lst, i = self._lru, self._lru_head
        entry = lst[i]
        if entry.b - entry.a > n and not self.cpu_cache_units:  # the usual: inside one entry
            entry.seg.end = entry.b = entry.b - n  # (above the segment's start: it stays)
            return
        host = self._host if self.cpu_cache_units else None
        i = evict(lst, i, n, self._starts, host, self.cpu_cache_units)
        if i > _CONSUMED and 2 * i > len(lst):
            del lst[:i]
            i = 0
        self._lru_head = i

    # ------------------------------------------------------------------ prefix reuse
    def lookup_prefix(self, req: Request) -> int:
        if req.hash_ids is None:
            return 0
        rid = req.req_id
        keys = self._keys.get(rid)
        if keys is None:
            keys = self._keys[rid] = prompt_keys(
                req.hash_ids, req.num_prompt_tokens, self.unit_tokens, self.source_block_tokens
            )
        chain = self._held.get(rid)
        start = chain[-1].holders[rid] if chain else 0
        if rid in self._swapped or self._tokens.get(rid, 0) != start * self.unit_tokens:
            raise KVInvariantError(f"request {rid} looked up its prefix while holding KV")
        # Leave at least one prompt token to compute: it emits the next token.
        most = min(len(keys), (req.num_prompt_tokens - 1) // self.unit_tokens)
        starts, free, tables = self._starts, self._free, self._tables
        p = start
        # The chain goes on in a segment that starts at p, or (a refresh) in the one it
        # holds last, if that one has grown since (engine/prefix_segments.py).
        seg = starts.get(keys[p]) if p < most else None
        if seg is None and chain and p < most:
            last = chain[-1]
            if last.end > p and last.keys[p] == keys[p]:
                seg = last
        if seg is None and not self._host:  # a miss: only accounting
            if not start:
                self.lookup_tokens += req.num_prompt_tokens
                self._hits += (self.now, req.num_prompt_tokens, 0)
            self._next_unit(rid, p, len(keys))
            return 0
        table = tables.get(rid)
        if table is None:
            table = []
        if chain is None:
            chain = []
        u = self.unit_blocks
        while seg is not None:
            # This segment's units from p, as far as the chain goes on in it.
            lim = most if most < seg.end else seg.end
            if seg.keys[lim - 1] != keys[lim - 1]:  # the chains part inside it
                lim = agree_until(keys, seg.keys, p, lim)
            top = seg.top
            if p < top:  # referenced: the blocks are where its holders have them
                stop = lim if lim < top else top
                table.extend(tables[seg.ref][p * u : stop * u])
            if lim > top:  # unreferenced: anonymous on the free list, any will do
                self._cached -= lim - top  # (p <= top: a holder here ends at top or below)
                take = (lim - top) * u
                table.extend(free[-take:])
                del free[-take:]
                seg.top = lim
                seg.ref = rid
                if seg.lru:
                    trim_lru(seg, lim)
            if not chain or chain[-1] is not seg:
                chain.append(seg)
            seg.holders[rid] = lim
            p = lim
            seg = starts.get(keys[p]) if p < most else None
        gpu = p
        if self._host and gpu < most:  # then in the CPU tier: copied back
            p = take_from_host(self, rid, keys, p, most, chain, table)
        cpu = p - gpu
        gained = (p - start) * self.unit_tokens
        looked = 0 if start else req.num_prompt_tokens  # a refresh looks up nothing new
        self.lookup_tokens += looked
        self.hit_tokens_gpu += (gpu - start) * self.unit_tokens
        self.hit_tokens_cpu += cpu * self.unit_tokens
        if cpu:
            self._copying[rid] = self._copying.get(rid, 0) + cpu * self.unit_tokens
        if looked or gained:
            self._hits += (self.now, looked, gained)
        self._next_unit(rid, p, len(keys))
        if chain:
            self._held[rid] = chain
            tables[rid] = table
            self._tokens[rid] = p * self.unit_tokens
        return gained

    def _next_unit(self, rid: int, held: int, units: int) -> None:
        """The request holds ``held`` of its prompt's ``units`` cached: it registers its
        next one when computed, or, holding all, is not open."""
        if held < units:
            self._open[rid] = (held + 1) * self.unit_tokens
        else:
            self._open.pop(rid, None)

    def peek_prefix(self, hash_ids: Sequence[int], prompt_tokens: int) -> int:
        # Segment by segment on the GPU, as lookup_prefix walks (most calls miss at the
        # first probe: a router asks every replica), then a unit at a time in the CPU tier
        # (cached units are prefix-closed on the GPU: a unit is evicted after the units
        # that continue its chain, so none of those is on the GPU past the walk's end).
        keys = unit_keys(tuple(hash_ids), prompt_tokens, self.unit_tokens, self.source_block_tokens)
        p, n = cached_until(self._starts, keys), len(keys)
        host = self._host
        if host:
            while p < n and keys[p] in host:
                p += 1
        return p * self.unit_tokens

    def take_transfer_tokens(self) -> int:
        moved, self._transfer = self._transfer, 0
        return moved

    def retired(self, batch: Sequence[tuple[Request, int]]) -> None:
        """An iteration (or fast-forwarded run) of ``batch`` ended: cache the prompt units
        its requests have now computed. Called only while :attr:`registering` (``_open``)."""
        open_ = self._open
        for r, _n in batch:
            at = open_.get(r.req_id)
            if at is not None and r.num_computed_tokens >= at:  # a unit is complete
                self._register(r.req_id, r.num_computed_tokens)

    def _register(self, rid: int, tokens: int) -> None:
        """Cache the request's prompt units that ``tokens`` of KV now cover (its next one
        at least: :meth:`retired` calls it when that one is complete)."""
        keys = self._keys[rid]
        chain = self._held.get(rid)
        seg = chain[-1] if chain else None
        k = seg.holders[rid] if seg is not None else 0
        full = tokens // self.unit_tokens
        closed = full >= len(keys)  # its last unit: nothing more to register
        if closed:
            full = len(keys)
        starts = self._starts
        n = full - k
        # A unit another request computed too (cached already) stays private, and so does
        # the rest of this prompt. Cached already: in the segment this request holds last,
        # which may go on past what it holds, or at a segment's start; and the units past
        # ``k`` are cached only if unit ``k`` is (engine/prefix_segments.py: a chain
        # enters a segment at its start; cached units are prefix-closed).
        if (seg is not None and seg.end > k and seg.keys[k] == keys[k]) or keys[k] in starts:
            n, closed = 0, True
        if closed:
            del self._open[rid]
        else:
            self._open[rid] = (full + 1) * self.unit_tokens
        if not n:
            return
        if seg is None or seg.owner != rid or seg.end != k:
            seg = Segment(keys, k, rid)
            starts[keys[k]] = seg
            if chain is None:
                chain = self._held[rid] = []
            chain.append(seg)
        seg.end = seg.top = seg.holders[rid] = k + n
        seg.ref = rid
        self.registered += n

    # ------------------------------------------------------------------ allocation
    def allocate(self, req_id: int, n_new_tokens: int) -> list[int] | None:
        # The plain manager's allocate with room made first (inlined: the hot path).
        if req_id in self._swapped:
            raise KVInvariantError(f"request {req_id} is swapped out: swap it in first")
        tokens = self._tokens.get(req_id, 0) + n_new_tokens
        table = self._tables.get(req_id)
        need = -(-tokens // self.block_size) - (len(table) if table is not None else 0)
        free = self._free
        if need > len(free):  # cached units count as free: not even evicting all helps
            return None
        if self._cached and need > len(free) - self._cached * self.unit_blocks:
            self._reclaim(need)  # more than the truly free blocks
        if table is None:
            table = self._tables[req_id] = []
        new: list[int] = []
        if need > 0:
            new = free[-need:]
            del free[-need:]
            table.extend(new)
        self._tokens[req_id] = tokens
        if self._copying and req_id in self._copying:
            self._transfer += self._copying.pop(req_id)
        return new

    def grow_many(self, req_ids: Sequence[int], n_new_tokens: int) -> bool:
        # Decodes grow past the prompt: nothing to register, only room to make (counted
        # when the truly free blocks may not do), then the plain manager's growth.
        cached = self._cached
        if not cached:
            return super().grow_many(req_ids, n_new_tokens)
        bs, tables, tokens, free = self.block_size, self._tables, self._tokens, self._free
        if n_new_tokens == 1:  # a request takes a block when its last one is full
            if len(free) - cached * self.unit_blocks < len(req_ids):  # maybe not enough
                takers = len([r for r in req_ids if not tokens[r] % bs])
                if takers > len(free) - cached * self.unit_blocks:  # more than truly free
                    if takers > len(free):
                        return False
                    self._reclaim(takers)
            kv_kernels.grow(tokens, tables, free, bs, req_ids, 1)  # the plain manager's
            return True
        if len(free) - cached * self.unit_blocks < len(req_ids) * (n_new_tokens // bs + 1):
            need = 0  # blocks_needed of each, summed
            for r in req_ids:
                more = -(-(tokens[r] + n_new_tokens) // bs) - len(tables[r])
                if more > 0:
                    need += more
            if need > len(free) - cached * self.unit_blocks:
                if need > len(free):
                    return False
                self._reclaim(need)
        kv_kernels.grow(tokens, tables, free, bs, req_ids, n_new_tokens)  # room made
        return True

    def free(self, req_id: int) -> int:
        if self._copying:  # released before it ran: no copy was needed
            self._copying.pop(req_id, None)
        chain = self._held.pop(req_id, None)
        self._open.pop(req_id, None)
        if not chain:
            return super().free(req_id)
        table = self._tables.pop(req_id)
        self._tokens.pop(req_id, None)
        lst = self._lru
        last = chain[-1]
        if last.owner == req_id:  # it registers nothing more (a requeued request, looking
            last.owner = None  # up again, registers into segments of its own)
        cut = last.holders[req_id]  # its units from ``cut`` on are nobody else's
        i = len(chain)
        while i:  # the tail first: it is evicted first
            i -= 1
            seg = chain[i]
            end = seg.holders.pop(req_id)
            if seg.ref != req_id:  # a holder reaching as far keeps these units
                break
            top = new_top(seg) if seg.holders else seg.lo
            if top >= end:
                break
            seg.top = top
            entry = LRUEntry(seg, top, end)  # unreferenced now: the newest in the LRU list
            lst.append(entry)
            seg.lru.append(entry)
            self._cached += end - top
            cut = top
            if top > seg.lo:  # the units below are held: so is everything before
                break
        # The segments before the one the loop stopped at only lose this holder (another
        # one reaches as far: their units stay referenced).
        for older in chain[:i]:
            del older.holders[req_id]
            if older.ref == req_id:
                new_top(older)
        if len(lst) - self._lru_head > 2 * self._cached + _COMPACT:  # mostly dead entries
            # Without evictions to consume them, hits and releases would grow it unbounded.
            self._lru = [e for e in lst[self._lru_head :] if e.a < e.b]  # (order kept)
            self._lru_head = 0
        # The released units' blocks join the free list (anonymous) with the private ones
        # (the shared ones cut off the table in place: a slice would copy the rest).
        n = len(table)
        if cut:
            del table[: cut * self.unit_blocks]
        self._free.extend(table)
        return n

    # Cutting into a held unit would free blocks others share (engine/prefix_shrink.py).
    shrink, shrink_many = prefix_shrink, prefix_shrink_many

    def forget(self, req_id: int) -> None:
        self._keys.pop(req_id, None)

    # A request's shared units stay on the GPU for the others: preempting it frees (and
    # swapping it out moves to the CPU) only the blocks it alone holds; swapping it back
    # in allocates all its blocks afresh (private).
    def num_request_blocks(self, req_id: int) -> int:
        table = self._tables.get(req_id)
        if table is None:
            return 0
        chain = self._held.get(req_id)
        if not chain:
            return len(table)
        return len(table) - self.unit_blocks * shared_units(chain, req_id)

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


def queue_lookup(kv: PrefixCachingKVManager, req: Request) -> None:
    """``req`` arrived: it looks its prefix up at the next decision (when the iterations
    before it have retired, in single steps and fast runs alike)."""
    if req.hash_ids is not None:
        kv.arrived.append(req)


def reuse_prefix(inst: Instance, req: Request) -> None:
    """``req`` is queued on ``inst`` with no KV: reuse its cached prefix, if any."""
    kv = inst.kv
    if isinstance(kv, PrefixCachingKVManager):
        kv.now = inst.env.now
    hit = kv.lookup_prefix(req)
    if hit:
        req.num_computed_tokens = hit
    # What it found this time, none included (a recompute-preempted request found its
    # prefix before: counted again, it could exceed its prompt).
    req.num_cached_tokens = hit


REFRESH_HEAD = 8
"""Queued requests (the oldest) that retry their lookup when the cache grew (module
docstring)."""


def refresh_queued(inst: Instance, kv: PrefixCachingKVManager) -> None:
    """Extend the cached prefix of the oldest queued requests with units registered since
    they looked up (a request queued behind the one computing its prefix then reuses it,
    as vLLM's lookup at scheduling time does). Runs before a decision; arrivals look up
    here. The queued retry only after a request arrived or ended here and the cache grew
    since the last retry: both stop a fast-forwarded run, so single steps and fast runs
    retry at the same decisions (a preemption or a release inside a decision does not,
    and would retry at different decisions). The instance calls it only then: when
    ``kv.arrived`` holds requests or ``inst.done`` grew past ``kv._ended_seen`` (tested
    there, to spare most decisions a call)."""
    arrived = kv.arrived
    if arrived:
        me = inst.instance_id
        for r in arrived:  # still queued here, holding nothing (not aborted, not moved)
            if r.status in _QUEUED and r.instance_id == me and not r.num_computed_tokens:
                reuse_prefix(inst, r)
        arrived.clear()
    kv._ended_seen = len(inst.done)
    if kv.registered == kv._refreshed_at:
        return
    kv._refreshed_at = kv.registered
    kv.now = inst.env.now  # the time the retries' hits are logged at
    for r in inst.waiting[:REFRESH_HEAD]:
        if r.hash_ids is not None and r.status in _QUEUED:
            gained = kv.lookup_prefix(r)
            r.num_computed_tokens += gained
            r.num_cached_tokens += gained
