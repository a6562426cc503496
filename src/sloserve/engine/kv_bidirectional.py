"""BROS's bidirectional KV blocks (§5): one block shared by an RT and a BE request.

Layout (§5.1): every block has ``block_size`` slots. Its RT owner fills slots from the
left, its BE owner from the right; either may be absent. A request may own many blocks;
its *last* block is the one it grows in.

Allocation (§5.2):

* **BE growth (FindBlock)** uses empty slots only: first the empty slots of its own
  blocks (the last one first), then new blocks "according to the maximum number of
  empty slots": fully free blocks first, then RT-only blocks with the most empty slots
  (the BE request becomes their right owner). A BE request never overwrites an RT slot.
* **RT growth (FindPreemptBlock)**: the RT request continues in the empty slots of its
  own blocks (the last one first: a BE peer that left an older block leaves room there),
  then takes a free block; only when no free block is left ("if no GPU
  blocks are available") does it take its BE peer's slots in its last block, then
  preempt the BE-only block with the most empty slots (it becomes the block's left
  owner, fills its empty slots, then overwrites).
* **Lazy checkpointing**: when RT growth reaches BE slots, exactly the BE slots about to
  be overwritten are checkpointed to the CPU tier (never the BE request's whole KV), and
  the block is recorded in the **preemption table** ``{block: (rt, be)}``. Overwriting
  needs room on the CPU tier; without it those BE slots are not claimable. Transfers
  count in :meth:`take_transfer_tokens` so that the instance prices them
  (``cost_model.swap_time``).
* **Restore**: the next time the BE request grows (is scheduled), its checkpointed slots
  come back first, placed like BE growth (they need not return to their old slots:
  positions inside the block table are bookkeeping here), and its preemption-table
  entries are cleared.
* **Progressive dropping** (nothing left to preempt) is the policy's job: it evicts
  whole requests with ``swap_out`` / ``free`` through the ordinary
  :class:`~sloserve.engine.interface.SchedulerOutput` preemptions.

Choices where the paper is silent:

* A request's class (its side) comes from :meth:`note_class`, which the instance calls on
  arrival, and is forgotten (:meth:`forget`) when it ends, so that copies stay small in
  long runs; unknown requests are RT.
* ``num_tokens`` is a request's whole KV (GPU slots plus checkpointed slots), so that the
  instance's token accounting is unchanged by lazy checkpoints; ``gpu_tokens`` is the
  GPU part.
* The CPU tier counts slots (``cpu_blocks × block_size``); its ``used_blocks`` is the
  slot total rounded up to blocks.
* A BE request whose slots in a block are all overwritten leaves that block.
* Feasibility depends on the order of operations, so the instance checks a batch
  exactly with :meth:`dry_run` (the same operations on a copy) instead of adding up
  block counts; policies plan on :meth:`clone`.

Invariants (:meth:`check_invariants`, in :mod:`~sloserve.engine.kv_bidirectional_invariants`):
no slot owned twice (left + right ≤ block size),
owners and counts agree, the free list holds exactly the ownerless blocks, no KV lost
(every request's tokens = its GPU slots + its checkpointed slots; swapped requests wholly
on the CPU) and capacity conserved (the CPU tier's counter equals what it holds).
"""

from __future__ import annotations

from collections.abc import Sequence

from sloserve.core.request import RequestClass
from sloserve.engine.kv import CPUSwapTier, KVCacheManager, KVInvariantError, KVOp

_NONE = -1


class BidirectionalKVManager(KVCacheManager):
    """Blocks shared by one RT request (from the left) and one BE request (from the right)."""

    exact_fit = True

    def __init__(self, num_blocks: int, block_size: int = 16, cpu_blocks: int = 0) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        if cpu_blocks < 0:
            raise ValueError("CPU swap capacity must be >= 0 blocks")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.left = [_NONE] * num_blocks
        """RT owner of each block (or -1)."""
        self.lcount = [0] * num_blocks
        self.right = [_NONE] * num_blocks
        """BE owner of each block (or -1)."""
        self.rcount = [0] * num_blocks
        """GPU-resident slots of the BE owner."""
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._free_set = [True] * num_blocks
        # One-sided blocks by empty slots, insertion-ordered (deterministic picks).
        self._be_only: list[dict[int, None]] = [{} for _ in range(block_size + 1)]
        self._rt_only: list[dict[int, None]] = [{} for _ in range(block_size + 1)]
        self._be_only_slots = 0
        """BE slots in BE-only blocks (what RT growth could overwrite there)."""
        self._rt_only_empty = 0
        """Empty slots in RT-only blocks (what BE growth could share)."""
        self._own_empty: dict[int, int] = {}
        """Empty slots in each request's own blocks (it may grow into any of them)."""
        self._tables: dict[int, list[int]] = {}
        self._tokens: dict[int, int] = {}
        """Whole KV of each request with GPU blocks or checkpoints (GPU + CPU slots)."""
        self._ckpt: dict[int, int] = {}
        """Checkpointed (CPU) slots of partially preempted BE requests."""
        self._swapped: dict[int, int] = {}
        """Tokens of wholly swapped-out requests."""
        self._is_rt: dict[int, bool] = {}
        self.preemption_table: dict[int, tuple[int, int]] = {}
        self._pt_blocks: dict[int, set[int]] = {}
        """Each request's blocks in the preemption table (to forget them in O(own))."""
        """Blocks where an RT request overwrote BE slots: block -> (rt, be)."""
        self.cpu = CPUSwapTier(cpu_blocks)
        self._cpu_slots = 0
        self._transfer = 0
        self.checkpointed_total = 0
        """Slots ever checkpointed lazily (for reports)."""

    # ------------------------------------------------------------------ copies
    def clone(self) -> BidirectionalKVManager:
        """An independent copy (policies plan on it; :meth:`dry_run` checks on it)."""
        c = object.__new__(BidirectionalKVManager)
        c.block_size = self.block_size
        c.num_blocks = self.num_blocks
        c.left = self.left.copy()
        c.lcount = self.lcount.copy()
        c.right = self.right.copy()
        c.rcount = self.rcount.copy()
        c._free = self._free.copy()
        c._free_set = self._free_set.copy()
        c._be_only = [d.copy() for d in self._be_only]
        c._rt_only = [d.copy() for d in self._rt_only]
        c._be_only_slots = self._be_only_slots
        c._rt_only_empty = self._rt_only_empty
        c._own_empty = self._own_empty.copy()
        c._tables = {k: v.copy() for k, v in self._tables.items()}
        c._tokens = self._tokens.copy()
        c._ckpt = self._ckpt.copy()
        c._swapped = self._swapped.copy()
        c._is_rt = self._is_rt.copy()
        c.preemption_table = self.preemption_table.copy()
        c._pt_blocks = {k: v.copy() for k, v in self._pt_blocks.items()}
        c.cpu = CPUSwapTier(self.cpu.capacity_blocks)
        c.cpu.used_blocks = self.cpu.used_blocks
        c._cpu_slots = self._cpu_slots
        c._transfer = self._transfer
        c.checkpointed_total = self.checkpointed_total
        return c

    def _surely_fits(self, ops: Sequence[KVOp]) -> bool:
        """A sufficient condition, O(ops): swap-outs fit the CPU tier in turn, and every
        growth (with restores of checkpointed slots), rounded up to whole blocks, fits
        the fully free blocks alone."""
        cpu = self._cpu_room()
        bs = self.block_size
        blocks = 0
        for op, rid, n in ops:
            if op == "swap_out":
                g = self.gpu_tokens(rid)
                if g > cpu:
                    return False
                cpu -= g
            elif op == "grow":
                blocks += -(-(n + self._ckpt.get(rid, 0)) // bs)
                if self._is_rt.get(rid, True) and self.shares_last_block(rid):
                    blocks += 1  # it may overwrite BE slots that a later grow restores
            elif op == "swap_in":
                blocks += -(-self._swapped.get(rid, 0) // bs)
        return blocks <= len(self._free)

    def dry_run(self, ops: Sequence[KVOp]) -> str | None:
        if self._surely_fits(ops):
            return None
        trial = self.clone()
        for i, (op, rid, n) in enumerate(ops):
            err = trial.apply_op(op, rid, n)
            if err:
                return f"operation {i} ({op} request {rid}): {err}"
        return None

    def apply_op(self, op: str, rid: int, n: int) -> str | None:
        """Apply one :data:`~sloserve.engine.kv.KVOp`; an error message, or None."""
        if op == "free":
            self.free(rid)
        elif op == "swap_out":
            if not self.can_swap_out(rid):
                return "the CPU swap tier is full"
            self.swap_out(rid)
        elif op == "swap_in":
            if self.swap_in(rid) is None:
                return "no room to swap it back in"
        elif op == "grow":
            if self.allocate(rid, n) is None:
                return f"no room for {n} more tokens"
        else:
            raise ValueError(f"unknown KV operation {op!r}")
        return None

    # ------------------------------------------------------------------ queries
    def note_class(self, req_id: int, req_class: RequestClass) -> None:
        self._is_rt[req_id] = req_class is not RequestClass.BE

    def forget(self, req_id: int) -> None:
        # Only once it holds nothing: its class places any KV it still has.
        if req_id not in self._tokens and req_id not in self._swapped:
            self._is_rt.pop(req_id, None)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def num_tokens(self, req_id: int) -> int:
        return self._tokens.get(req_id, 0)

    def gpu_tokens(self, req_id: int) -> int:
        return self._tokens.get(req_id, 0) - self._ckpt.get(req_id, 0)

    def checkpointed_tokens(self, req_id: int) -> int:
        """KV slots of the request checkpointed to the CPU (0 for RT requests)."""
        return self._ckpt.get(req_id, 0)

    def checkpointed_blocks(self, req_id: int) -> int:
        """M_j^cpu: the request's checkpointed slots in blocks (whole swap-outs count
        all their blocks), what bringing it back costs."""
        if req_id in self._swapped:
            return -(-self._swapped[req_id] // self.block_size)
        return -(-self._ckpt.get(req_id, 0) // self.block_size)

    def shares_last_block(self, req_id: int) -> bool:
        """Whether the request's last block has a peer on the other side."""
        table = self._tables.get(req_id)
        if not table:
            return False
        b = table[-1]
        return self.left[b] != _NONE and self.right[b] != _NONE

    def num_request_blocks(self, req_id: int) -> int:
        table = self._tables.get(req_id)
        return len(table) if table is not None else 0

    def _room_last(self, rid: int, rt: bool, cpu_room: int) -> int:
        """Slots the request can take in its own blocks without a new block."""
        return self._own_empty.get(rid, 0)

    def blocks_needed(self, req_id: int, n_new_tokens: int) -> int:
        """Fully free blocks the request would take (an upper bound: RT requests may
        preempt BE blocks, BE requests may share RT blocks instead)."""
        rt = self._is_rt.get(req_id, True)
        need = n_new_tokens + self._ckpt.get(req_id, 0)
        more = need - self._room_last(req_id, rt, self._cpu_room())
        return max(0, -(-more // self.block_size))

    def swap_in_blocks_needed(self, req_id: int) -> int:
        return -(-self._swapped[req_id] // self.block_size)

    def can_swap_out(self, req_id: int) -> bool:
        return self.gpu_tokens(req_id) <= self._cpu_room()

    @property
    def cpu_free_slots(self) -> int:
        """Slots left on the CPU tier (swap-outs and lazy checkpoints need them)."""
        return self._cpu_room()

    def take_transfer_tokens(self) -> int:
        t, self._transfer = self._transfer, 0
        return t

    def _cpu_room(self) -> int:
        return self.cpu.capacity_blocks * self.block_size - self._cpu_slots

    def _cpu_add(self, slots: int) -> None:
        self._cpu_slots += slots
        self.cpu.used_blocks = -(-self._cpu_slots // self.block_size)

    # ------------------------------------------------------------------ block bookkeeping
    def _owners_empty(self, b: int, sign: int) -> None:
        left, right = self.left[b], self.right[b]
        empty = self.block_size - self.lcount[b] - self.rcount[b]
        if empty:
            own = self._own_empty
            for owner in (left, right):
                if owner != _NONE:
                    own[owner] = own.get(owner, 0) + sign * empty

    def _unindex(self, b: int) -> None:
        """Remove block ``b`` from the free list / one-sided indexes before changing it."""
        left, right = self.left[b], self.right[b]
        if left != _NONE or right != _NONE:
            self._owners_empty(b, -1)
        if left == _NONE and right == _NONE:
            if self._free_set[b]:
                self._free_set[b] = False
                self._free.remove(b) if self._free[-1] != b else self._free.pop()
        elif left == _NONE:
            rc = self.rcount[b]
            del self._be_only[self.block_size - rc][b]
            self._be_only_slots -= rc
        elif right == _NONE:
            lc = self.lcount[b]
            del self._rt_only[self.block_size - lc][b]
            self._rt_only_empty -= self.block_size - lc

    def _index(self, b: int) -> None:
        left, right = self.left[b], self.right[b]
        if left != _NONE or right != _NONE:
            self._owners_empty(b, +1)
        if left == _NONE and right == _NONE:
            self._free_set[b] = True
            self._free.append(b)
        elif left == _NONE:
            rc = self.rcount[b]
            self._be_only[self.block_size - rc][b] = None
            self._be_only_slots += rc
        elif right == _NONE:
            lc = self.lcount[b]
            self._rt_only[self.block_size - lc][b] = None
            self._rt_only_empty += self.block_size - lc

    def _pick_free(self) -> int:
        b = self._free.pop()
        self._free_set[b] = False
        return b

    @staticmethod
    def _pick_most_empty(index: list[dict[int, None]]) -> int:
        for e in range(len(index) - 1, 0, -1):
            bucket = index[e]
            if bucket:
                return next(iter(bucket))
        return _NONE

    def _overwrite(self, b: int, k: int) -> None:
        """Checkpoint ``k`` BE slots of block ``b`` (lazy checkpointing)."""
        be = self.right[b]
        self.rcount[b] -= k
        self._ckpt[be] = self._ckpt.get(be, 0) + k
        self._cpu_add(k)
        self._transfer += k
        self.checkpointed_total += k
        self._forget_block(b)
        entry = (self.left[b], be)
        self.preemption_table[b] = entry
        for rid in entry:
            self._pt_blocks.setdefault(rid, set()).add(b)
        if self.rcount[b] == 0:
            self.right[b] = _NONE
            self._tables[be].remove(b)

    # ------------------------------------------------------------------ growth
    def fits(self, req_id: int, rt: bool, k: int) -> bool:
        """Whether the request (on side ``rt``) can place ``k`` more slots now."""
        return self._capacity(req_id, rt, k)

    def _capacity(self, rid: int, rt: bool, k: int) -> bool:
        """Whether ``k`` more slots fit (the rules of :meth:`_grow`, without changes).

        O(block size): the total room does not depend on the order in which
        :meth:`_grow` takes blocks, only on the empty slots (kept as running totals) and
        the CPU room.
        """
        cpu = self._cpu_room()
        bs = self.block_size
        room = self._room_last(rid, rt, cpu)
        if room >= k:
            return True
        room += len(self._free) * bs
        if room >= k:
            return True
        if rt:
            # Its last block's BE peer is overwritable only while no free block is left:
            # with free blocks, :meth:`_grow` fills them first, and its last block is then
            # a fresh RT-only one (the old peer's slots are out of reach).
            table = self._tables.get(rid)
            last_peer = self.rcount[table[-1]] if table and not self._free else 0
            overwritable = self._be_only_slots + last_peer
            empty = self._n_be_only() * bs - self._be_only_slots
            return room + empty + min(max(0, cpu), overwritable) >= k
        return room + self._rt_only_empty >= k

    def _n_be_only(self) -> int:
        return sum(len(d) for d in self._be_only)

    def _grow(self, rid: int, rt: bool, k: int) -> None:
        """Place ``k`` slots for the request (the caller checked :meth:`_capacity`)."""
        bs = self.block_size
        table = self._tables.setdefault(rid, [])
        while k > 0:
            if table:
                b = table[-1]
                take, over = 0, 0
                if self._own_empty.get(rid, 0) > 0:
                    # empty slots in its own blocks, the last one first (a peer that left
                    # an older block leaves room there)
                    for b in reversed(table):
                        empty = bs - self.lcount[b] - self.rcount[b]
                        if empty:
                            take = min(k, empty)
                            break
                elif rt and not self._free:
                    # No GPU block available: preempt the peer's slots (checkpointed).
                    take = over = min(k, self.rcount[b], self._cpu_room())
                if take > 0:
                    self._unindex(b)
                    if over:
                        self._overwrite(b, over)
                    if rt:
                        self.lcount[b] += take
                    else:
                        self.rcount[b] += take
                    self._index(b)
                    k -= take
                    continue
            # a new block
            if self._free:
                b = self._pick_free()
            else:
                b = self._pick_most_empty(self._be_only if rt else self._rt_only)
                if b == _NONE and rt and self._be_only[0] and self._cpu_room() > 0:
                    b = next(iter(self._be_only[0]))
                if b == _NONE:  # _capacity said it fits: a bug
                    raise KVInvariantError(f"request {rid}: no block for {k} more slots")
                self._unindex(b)
            if rt:
                self.left[b] = rid
            else:
                self.right[b] = rid
            table.append(b)
            self._index(b)

    def allocate(self, req_id: int, n_new_tokens: int) -> list[int] | None:
        if req_id in self._swapped:
            raise KVInvariantError(f"request {req_id} is swapped out: swap it in first")
        rt = self._is_rt.get(req_id, True)
        restore = self._ckpt.get(req_id, 0)
        k = n_new_tokens + restore
        if not self._capacity(req_id, rt, k):
            return None
        before = len(self._tables.get(req_id, ()))
        if restore:
            # The checkpointed slots come back first; they are placed like new growth.
            del self._ckpt[req_id]
            self._cpu_add(-restore)
            self._transfer += restore
            self._forget_preemptions(req_id)
        self._grow(req_id, rt, k)
        self._tokens[req_id] = self._tokens.get(req_id, 0) + n_new_tokens
        return self._tables[req_id][before:]

    def grow_many(self, req_ids: Sequence[int], n_new_tokens: int) -> bool:
        ops: list[KVOp] = [("grow", r, n_new_tokens) for r in req_ids]
        if self.dry_run(ops) is not None:
            return False
        for r in req_ids:
            self.allocate(r, n_new_tokens)
        return True

    def decode_blocks_needed(self, req_ids: Sequence[int]) -> int:
        return sum(self.blocks_needed(r, 1) for r in req_ids)

    # ------------------------------------------------------------------ release
    def _release_gpu(self, rid: int) -> int:
        """Drop the request's GPU slots; the number of slots released."""
        table = self._tables.pop(rid, None)
        if not table:
            self._own_empty.pop(rid, None)
            return 0
        slots = 0
        rt = self._is_rt.get(rid, True)
        for b in table:
            self._unindex(b)
            if rt:
                slots += self.lcount[b]
                self.left[b] = _NONE
                self.lcount[b] = 0
            else:
                slots += self.rcount[b]
                self.right[b] = _NONE
                self.rcount[b] = 0
            self._index(b)
        if self._own_empty.pop(rid, 0):
            raise KVInvariantError(f"request {rid}: empty-slot count not zero after release")
        return slots

    def _forget_block(self, b: int) -> None:
        entry = self.preemption_table.pop(b, None)
        if entry is not None:
            for rid in entry:
                blocks = self._pt_blocks.get(rid)
                if blocks is not None:
                    blocks.discard(b)
                    if not blocks:
                        del self._pt_blocks[rid]

    def _forget_preemptions(self, rid: int) -> None:
        for b in list(self._pt_blocks.get(rid, ())):
            self._forget_block(b)

    def free(self, req_id: int) -> int:
        blocks = self.num_request_blocks(req_id)
        self._release_gpu(req_id)
        self._forget_preemptions(req_id)
        self._tokens.pop(req_id, None)
        ck = self._ckpt.pop(req_id, 0)
        if ck:
            self._cpu_add(-ck)
        return blocks

    def swap_out(self, req_id: int) -> int:
        gpu = self.gpu_tokens(req_id)
        if gpu > self._cpu_room():
            raise KVInvariantError(f"request {req_id}: CPU swap tier is full")
        total = self._tokens.pop(req_id, 0)
        self._release_gpu(req_id)
        self._forget_preemptions(req_id)
        self._ckpt.pop(req_id, None)  # its checkpointed slots stay on the CPU, now counted here
        self._cpu_add(gpu)
        self._swapped[req_id] = total
        return gpu

    def swap_in(self, req_id: int) -> int | None:
        tokens = self._swapped[req_id]
        rt = self._is_rt.get(req_id, True)
        # Its CPU copy leaves first: an RT request may checkpoint BE slots into that room.
        self._cpu_add(-tokens)
        if not self._capacity(req_id, rt, tokens):
            self._cpu_add(tokens)
            return None
        del self._swapped[req_id]
        self._grow(req_id, rt, tokens)
        self._tokens[req_id] = tokens
        return tokens

    def slot_runs(self, req_id: int) -> list[tuple[int, int]]:
        # RT slots are a block's left end, BE slots its right end (module docstring).
        bs, table = self.block_size, self._tables.get(req_id, ())
        if self._is_rt.get(req_id, True):
            return [(b * bs, self.lcount[b]) for b in table]
        return [((b + 1) * bs - self.rcount[b], self.rcount[b]) for b in table]

    def drop_swapped(self, req_id: int) -> None:
        tokens = self._swapped.pop(req_id, None)
        if tokens is not None:
            self._cpu_add(-tokens)

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        from sloserve.engine.kv_bidirectional_invariants import check_bidirectional

        check_bidirectional(self)
