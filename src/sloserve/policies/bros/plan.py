"""The dry-run batch plan of one BROS decision (Algorithm 1's FindBlock and
FindPreemptBlock, §5): the candidates, the KV blocks and running slots they use up, and
the decision that combines the plan with the batch's cost and budgets.

:class:`_Plan` counts paged blocks (exact); :class:`_SharedPlan` places candidates on a copy
of the :class:`~sloserve.engine.kv_bidirectional.BidirectionalKVManager` (§5.1), where what
fits depends on which blocks were taken before, and checks the final batch with the
manager's dry run. With bidirectional blocks, taking a request out of the batch frees its
batch slot and time but the plan keeps its memory (placements on shared blocks cannot be
undone cheaply; ``reclaims=False``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sloserve.core.request import Request, RequestClass, RequestStatus
from sloserve.engine.interface import PreemptionMode
from sloserve.engine.kv import KVCacheManager, KVOp
from sloserve.engine.kv_bidirectional import BidirectionalKVManager
from sloserve.policies.bros.cost import _Cost, _is_decode

_RUNNING = RequestStatus.RUNNING
_SWAPPED = RequestStatus.PREEMPTED_SWAPPED


@dataclass(slots=True)
class _Cand:
    """An RT or BE request under consideration, with what it would cost to run."""

    req: Request
    residual: float
    n: int = 0
    need: int = 0
    swap_tokens: int = 0
    dropped: bool = False
    """Progressive dropping evicted requests to make room for it."""


@dataclass
class _Plan:
    """The KV blocks and running slots the decision has used up so far (paged blocks:
    counting blocks is exact)."""

    kv: KVCacheManager
    bs: int
    free: int
    cpu_free: int
    n_running: int
    max_running: int
    preempt: list[tuple[Request, PreemptionMode]] = field(default_factory=list)
    gone: set[int] = field(default_factory=set)
    reclaims: bool = True
    """Whether taking a request out of the batch gives its memory back to the plan."""

    def need(self, r: Request, n: int) -> int:
        """Blocks ``r`` needs to process ``n`` tokens (a swapped request: all of them)."""
        if r.status is _SWAPPED:
            return -(-(r.num_computed_tokens + n) // self.bs)
        return self.kv.blocks_needed(r.req_id, n)

    def _slot_ok(self, r: Request) -> bool:
        return r.status is _RUNNING or self.n_running < self.max_running

    def fits(self, r: Request, need: int, reserve: int = 0) -> bool:
        """Whether ``r`` fits, leaving ``reserve`` blocks free."""
        return need + reserve <= self.free and self._slot_ok(r)

    def take(self, r: Request, need: int) -> None:
        self.free -= need
        if r.status is not _RUNNING:
            self.n_running += 1

    def give_back(self, r: Request, need: int) -> None:
        self.free += need
        if r.status is not _RUNNING:
            self.n_running -= 1

    def _mode(self, victim: Request, mode: PreemptionMode) -> PreemptionMode:
        blocks = self.kv.num_request_blocks(victim.req_id)
        if mode is PreemptionMode.SWAP and blocks > self.cpu_free:
            return PreemptionMode.RECOMPUTE  # the CPU tier is full
        return mode

    def evict(self, victim: Request, mode: PreemptionMode) -> PreemptionMode:
        """Evict ``victim`` in the plan; the mode used (swap falls back to recompute)."""
        blocks = self.kv.num_request_blocks(victim.req_id)
        mode = self._mode(victim, mode)
        if mode is PreemptionMode.SWAP:
            self.cpu_free -= blocks
        self.preempt.append((victim, mode))
        self.gone.add(victim.req_id)
        self.free += blocks
        self.n_running -= 1
        return mode

    def room_after(self, cand: Request, need: int, victims: Sequence[Request]) -> bool:
        """Whether evicting all ``victims`` would make ``cand`` fit."""
        room = self.free + sum(self.kv.num_request_blocks(r.req_id) for r in victims)
        slots = self.n_running + (0 if cand.status is _RUNNING else 1) - len(victims)
        return need <= room and slots <= self.max_running

    def finalize(
        self, chosen: list[_Cand], swap_in: list[Request]
    ) -> tuple[list[_Cand], list[Request]]:
        """The batch as the instance will apply it (paged: counting was exact)."""
        return chosen, swap_in


class _SharedPlan(_Plan):
    """Plans on a copy of the bidirectional manager, where what fits depends on which
    blocks were taken before. While everything planned fits the fully free blocks alone
    (each request's tokens rounded up to whole blocks), it only counts; after that,
    candidates are placed on a copy in the order the policy adds them. :meth:`finalize`
    checks the final batch in the instance's order (exactly, with the manager's dry run)
    and drops what does not fit then (rare: the two orders differ only between prefills
    and decodes)."""

    def __init__(self, kv: BidirectionalKVManager, **kw: Any) -> None:
        super().__init__(kv=kv, reclaims=False, **kw)
        self.bkv = kv
        self._sim: BidirectionalKVManager | None = None
        self._log: list[tuple[str, Request, int]] = []
        self._blocks = 0
        self.placed: set[int] = set()
        self._swap_room = kv.cpu_free_slots
        """CPU slots left for swap-outs in the instance's order (all before any growth)."""

    @property
    def sim(self) -> BidirectionalKVManager:
        """The copy, made (and the plan so far replayed on it) on first use."""
        if self._sim is None:
            sim = self.bkv.clone()
            for op, r, n in self._log:
                if op == "take":
                    self._place(sim, r, n)
                elif op == "swap_out":
                    sim.swap_out(r.req_id)
                else:
                    sim.free(r.req_id)
            self._sim = sim
        return self._sim

    @staticmethod
    def _place(sim: BidirectionalKVManager, r: Request, n: int) -> None:
        if r.status is _SWAPPED:
            sim.swap_in(r.req_id)
        if sim.allocate(r.req_id, n) is None:  # fits() said yes: a bug
            raise RuntimeError(f"BROS plan: request {r.req_id} does not fit after all")

    def need(self, r: Request, n: int) -> int:
        return n  # tokens: placement, not a block count, decides

    @staticmethod
    def _slots_for(kv: BidirectionalKVManager, r: Request, n: int) -> int:
        if r.status is _SWAPPED:
            return r.num_computed_tokens + n
        return n + kv.checkpointed_tokens(r.req_id)

    def _bound_blocks(self, r: Request, n: int) -> int:
        """Fully free blocks that surely hold ``r``'s growth, plus one when an RT request
        shares its last block with a BE request (whose slots it may overwrite: restoring
        them later takes at most one block per overwriting RT request)."""
        kv = self.bkv
        blocks = -(-self._slots_for(kv, r, n) // kv.block_size)
        if r.req_class is not RequestClass.BE and kv.shares_last_block(r.req_id):
            blocks += 1
        return blocks

    def _fits_sim(self, sim: BidirectionalKVManager, r: Request, n: int) -> bool:
        rt = r.req_class is not RequestClass.BE
        return sim.fits(r.req_id, rt, self._slots_for(sim, r, n))

    def fits(self, r: Request, need: int, reserve: int = 0) -> bool:
        if not self._slot_ok(r):
            return False
        bkv = self.bkv
        if self._sim is None:
            blocks = self._blocks + self._bound_blocks(r, need)
            if blocks + reserve <= bkv.num_free_blocks:
                return True  # the free blocks alone hold everything planned
        sim = self.sim
        if not self._fits_sim(sim, r, need):
            return False
        return reserve == 0 or sim.num_free_blocks - sim.blocks_needed(r.req_id, need) >= reserve

    def take(self, r: Request, need: int) -> None:
        if r.req_id not in self.placed:  # a replaced RT request put back is placed already
            self.placed.add(r.req_id)
            if self._sim is None:
                self._blocks += self._bound_blocks(r, need)
                self._log.append(("take", r, need))
            else:
                self._place(self._sim, r, need)
        if r.status is not _RUNNING:
            self.n_running += 1

    def give_back(self, r: Request, need: int) -> None:
        # The placement stays (conservative); finalize() checks the batch exactly.
        if r.status is not _RUNNING:
            self.n_running -= 1

    def _mode(self, victim: Request, mode: PreemptionMode) -> PreemptionMode:
        """Swap only when the victim's GPU slots fit the CPU tier both in the instance's
        order (every swap-out before any growth, so restores and swap-ins of the plan
        have not freed room yet) and on the copy (where placements made so far may have
        used CPU room for lazy checkpoints); else recompute."""
        if mode is PreemptionMode.SWAP:
            gpu = self.bkv.gpu_tokens(victim.req_id)
            if gpu > self._swap_room or not self.sim.can_swap_out(victim.req_id):
                return PreemptionMode.RECOMPUTE
        return mode

    def evict(self, victim: Request, mode: PreemptionMode) -> PreemptionMode:
        mode = self._mode(victim, mode)
        if mode is PreemptionMode.SWAP:
            self._swap_room -= self.bkv.gpu_tokens(victim.req_id)
            self.sim.swap_out(victim.req_id)
        else:
            self.sim.free(victim.req_id)
        self.preempt.append((victim, mode))
        self.gone.add(victim.req_id)
        self.n_running -= 1
        return mode

    def room_after(self, cand: Request, need: int, victims: Sequence[Request]) -> bool:
        slots = self.n_running + (0 if cand.status is _RUNNING else 1) - len(victims)
        if slots > self.max_running:
            return False
        trial = self.sim.clone()  # exact: which slots free up depends on who shares blocks
        for v in victims:
            trial.free(v.req_id)  # room-wise, a swap-out frees the same GPU slots
        return self._fits_sim(trial, cand, need)

    def finalize(
        self, chosen: list[_Cand], swap_in: list[Request]
    ) -> tuple[list[_Cand], list[Request]]:
        chosen = list(chosen)
        while True:
            ops: list[KVOp] = [
                ("swap_out" if m is PreemptionMode.SWAP else "free", v.req_id, 0)
                for v, m in self.preempt
            ]
            ops += [("swap_in", c.req.req_id, 0) for c in chosen if c.req.status is _SWAPPED]
            ops += [("grow", c.req.req_id, c.n) for c in chosen if not _is_decode(c.req)]
            ops += [("grow", c.req.req_id, c.n) for c in chosen if _is_decode(c.req)]
            if self.bkv.dry_run(ops) is None:
                return chosen, [c.req for c in chosen if c.req.status is _SWAPPED]
            chosen.remove(self._first_misfit(chosen))

    def _first_misfit(self, chosen: list[_Cand]) -> _Cand:
        sim = self.bkv.clone()
        for v, m in self.preempt:
            if m is PreemptionMode.SWAP:
                sim.swap_out(v.req_id)
            else:
                sim.free(v.req_id)
        for c in chosen:
            if c.req.status is _SWAPPED and sim.swap_in(c.req.req_id) is None:
                return c
        order = [c for c in chosen if not _is_decode(c.req)]
        order += [c for c in chosen if _is_decode(c.req)]
        for c in order:
            if sim.allocate(c.req.req_id, c.n) is None:
                return c
        raise RuntimeError("BROS plan: the dry run failed but every operation fits")


@dataclass
class _Decision:
    """One call's batch under construction and the budgets it has left."""

    plan: _Plan
    cost: _Cost
    t_min: float
    t_avg: float
    b_curr: int
    budget_c: int
    budget_p: int
    rt_ready: list[_Cand] = field(default_factory=list)
    be_ready: list[_Cand] = field(default_factory=list)
    in_batch: set[int] = field(default_factory=set)

    def add(self, c: _Cand, ready: list[_Cand]) -> None:
        r = c.req
        self.plan.take(r, c.need)
        self.cost.add(r, c.n, c.swap_tokens)
        self.budget_c -= c.n
        if not _is_decode(r):
            self.budget_p -= c.n
        ready.append(c)
        self.in_batch.add(r.req_id)

    def remove(self, c: _Cand, ready: list[_Cand]) -> None:
        r = c.req
        self.plan.give_back(r, c.need)
        self.cost.add(r, c.n, c.swap_tokens, sign=-1)
        self.budget_c += c.n
        if not _is_decode(r):
            self.budget_p += c.n
        if ready and ready[-1] is c:
            ready.pop()
        else:
            ready.remove(c)
        self.in_batch.discard(r.req_id)
