"""BROS (§4): co-serving real-time (RT) and best-effort (BE) requests on one replica.

Algorithm 1, the priority-based packing algorithm, runs at every iteration:

1. **RT first.** Every live RT request (waiting, pending = holding KV, swapped) is ranked by
   its *residual time* to its next token's deadline, ``T_SLO − t_i − (k_i − 1)·T_avg``:
   ``T_SLO`` is the TTFT target before the first token and the TPOT target after it,
   ``t_i`` the time since arrival (first token) or since the last token, ``k_i`` the
   iterations the current token still needs (1, or the prefill chunks left with
   ``chunked_prefill``) and ``T_avg`` the moving average of the measured iteration time.
   ``T_min^res`` is the smallest residual time. The most urgent RT requests join the batch
   while the batch holds fewer than ``B_curr`` requests, their KV blocks can be found or
   preempted (FindPreemptBlock: free blocks, then BE blocks, then progressive dropping)
   and the cost model's time for the batch stays within ``T_min^res``.
2. **BE next**, by ascending checkpointed (CPU) KV blocks ``M_j^cpu``: a BE request is
   *packed* when the batch still has room in ``B_curr`` and in ``T_min^res``; otherwise it
   *replaces* the least urgent RT request of the batch when that makes it fit; otherwise
   the loop stops. A BE request only takes free KV memory (FindBlock), never evicts; one
   that finds no memory is skipped (memory, unlike the size and time budgets, is not
   monotone over the BE order).
3. **Adaptive batch size**: ``B_curr`` starts at ``B_base`` (128), doubles (up to R_max)
   after an iteration with no RT request in the queues, and goes back to ``B_base`` when
   the estimated batch time of the RT loop exceeds ``T_min^res`` (a predicted miss).
4. The iteration time the policy predicts, and the engine charges
   (:attr:`overlap_swap`), is ``max(execution, swap)`` (§4.1: transfers are asynchronous).
   The predicted swap covers what comes back from the CPU for the batch (eq. 5's
   ``M^cpu``: swapped requests' whole KV, BE requests' checkpointed slots) and the
   swap-outs of progressive dropping; the lazy checkpoints of overwritten BE slots are
   charged by the engine but not predicted (they depend on placement, and are at most
   the RT requests' new tokens).

Request pulling (Figure 8): instead of sorting all RT requests, the never-started waiting
RT requests are already in residual order (same TTFT target, arrival order), so only the
others (pending, swapped, recompute-preempted) are sorted and the two ordered streams are
merged lazily; the loop stops pulling as soon as the batch is decided.

KV memory: with ``bidirectional=True`` (policy ``bros``) the replica uses
:class:`~sloserve.engine.kv_bidirectional.BidirectionalKVManager` (via :meth:`make_kv`),
where an RT request takes over BE blocks and only the overwritten BE slots are
checkpointed. ``bidirectional=False`` (``bros-nobicache``, the §7.4.1 ablation) uses the
ordinary paged cache, and an RT request that finds no free block evicts others with
recompute ("we simply perform recomputation for requests failing to acquire cache blocks").

Choices where the paper is silent (parameters of :class:`BROSConfig` where they matter):

* An RT request whose deadline has already passed still ranks first (most negative
  residual), but ``T_min^res`` is taken over requests that can still make it (residual
  > 0); with none, no time cap applies, only ``B_curr``, C and P. The most urgent RT
  request always joins (a batch cannot be faster than one request): a batch is never
  empty for lack of time.
* Replacement (step 2) only evicts from the batch an RT request that can afford to skip
  this iteration (residual − estimated batch time > ``T_avg``; ``replace_guard``), since
  replacing the RT requests that are about to miss would defeat the RT loop; an RT
  request it removes keeps its KV cache (it stays pending). An RT request for which
  progressive dropping evicted requests is never replaced (whatever ``replace_guard``):
  BE requests would take the room just made for it, and next iteration it would drop
  them again (a livelock with ``replace_guard=False``).
* An RT request for which FindPreemptBlock fails even with progressive dropping is
  skipped, not the end of the RT loop (Algorithm 1 breaks there): memory is not monotone
  over the ranking, and breaking can deadlock a replica whose most urgent request (say, a
  long refill) can never fit while a less urgent one holds the memory and could run.
* Progressive dropping (no free and no BE block left for an urgent RT request): BE
  requests not in the batch first (most checkpointed slots first: they cannot run until
  their slots come back; then newest), then RT requests not in the batch that
  are less urgent than the candidate (most residual time first) — RT requests only for a
  running candidate or a new one that can still make its TTFT, not for a dropped RT
  request coming back (``literal_rt_drops``: its next-token deadline keeps running, so it
  is soon the most urgent and the literal rule time-slices the KV cache among RT requests
  by eviction. Measured, llama-2-7b-a100 with a 4,096-token cache, 60 RT requests at
  8/s (prompts 10-600, outputs 5-300 tokens) beside 80 BE requests (prompts 500-1,000):
  literal 4,294 preemptions, TTFT attainment 0.42, last RT request done at 90 s; guarded
  115, 1.00, 13 s; the same with 16k tokens or more) — evicted with ``swap``
  (recompute when the CPU tier is full) for ``bros`` and with ``recompute`` for
  ``bros-nobicache`` (``preemption_mode``); nobody is evicted unless evicting all
  candidates makes room. When nothing at all can run (BE requests waiting for room that
  partially checkpointed BE requests hold, and no RT request left to finish), BE
  requests are dropped the same way until one can run: the replica never stalls.
* With bidirectional blocks, replacing an RT request frees its batch slot and time but
  the plan keeps its memory (placements on shared blocks cannot be undone cheaply), so
  replacement is not tried for BE requests that failed for memory.
* Ties among BE requests (equal ``M_j^cpu``): pending ones (KV on the GPU) before new
  ones — the cheapest to continue first — then ``order`` (arrival by default).
* BE admission headroom: a new BE request must leave ``watermark`` (5%) of the KV blocks
  free, unless the replica holds nothing else (then the headroom would protect no one,
  and a request larger than M minus the watermark would wait forever). The paper admits
  BE requests wherever FindBlock finds slots (``watermark=0``); a little headroom lets
  arriving RT prompts start without preempting BE blocks. Measured (llama-2-7b-a100,
  ShareGPT RT at 8 req/s beside closed-loop BE batches of 256, 60 s window): watermark
  0 / 0.05 / 0.1 -> RT TTFT attainment 0.973 / 0.986 / 0.996, BE requests finished
  476 / 470 / 468.
* Without ``chunked_prefill`` (the default, as the paper's Orca-style selective batching)
  a prompt runs whole; a prefill that does not fit C or P is a failed fit (stops the RT
  loop, or triggers replacement in the BE loop) like a time or size failure.
* ``T_avg``: exponential moving average (``t_avg_alpha``) of measured iteration times;
  before the first iteration, the cost model's time of one decode step.
* ``B_curr`` doubles after an iteration in which no RT request was queued ("no RT requests
  are detected"), capped at R_max.
* Batches are never marked repeatable: residual times change every iteration.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sloserve.core.errors import ConfigError
from sloserve.core.request import Request, RequestClass, RequestStatus
from sloserve.costmodel.base import BatchStats, CostModel
from sloserve.engine.interface import (
    InstanceView,
    Limits,
    PreemptionMode,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)
from sloserve.engine.kv import KVCacheManager, KVOp
from sloserve.engine.kv_bidirectional import BidirectionalKVManager

_INF = math.inf
_RUNNING = RequestStatus.RUNNING
_SWAPPED = RequestStatus.PREEMPTED_SWAPPED


@dataclass(frozen=True)
class BROSConfig:
    """Parameters of BROS (§4.2, §5)."""

    batch_base: int = 128
    """B_base: the batch size BROS starts from and backs off to."""
    batch_max: int | None = None
    """Cap on B_curr when it doubles (default R_max)."""
    adaptive_batch: bool = True
    """Double B_curr when no RT request is queued, reset on a predicted miss (§4.2)."""
    bidirectional: bool = True
    """Bidirectional KV blocks (§5); False: paged blocks and recompute (``bros-nobicache``)."""
    preemption_mode: PreemptionMode | None = None
    """How progressive dropping evicts (default: swap with bidirectional blocks, else
    recompute); swap falls back to recompute when the CPU tier is full."""
    order: Literal["fcfs", "priority", "input", "output"] = "fcfs"
    """Tie-break among BE requests with equal checkpointed blocks (after pending ones):
    arrival, priority, shortest input or shortest predicted output first."""
    watermark: float = 0.05
    """Fraction of KV blocks a newly admitted BE request must leave free (vLLM's watermark),
    so that arriving RT requests find room without dropping anyone."""
    chunked_prefill: bool = False
    """Split prompts over iterations to fit P (the paper runs prompts whole)."""
    prefill_tokens: int | None = None
    """Default P when the user sets none; None means P = C."""
    replace_guard: bool = True
    """BE replaces only RT requests that can skip this iteration and still meet their
    deadline (False: any least urgent RT request, literally as Algorithm 1)."""
    literal_rt_drops: bool = False
    """Progressive dropping evicts less urgent RT requests for any RT candidate, literally
    as §5.2. False (default): only for a running candidate or a new one that can still
    make its TTFT; a dropped RT request coming back (refill, swap-in) or a late arrival
    waits for free or BE memory instead. Dropped RT requests are soon the most urgent
    (their next-token deadline keeps running), so under memory overload the literal rule
    time-slices the KV cache among RT requests by eviction, re-prefilling them again and
    again: a livelock."""
    t_avg_alpha: float = 0.2
    """Weight of the newest iteration in the moving-average iteration time T_avg."""
    overlap_swap: bool = True
    """Iteration time = max(execution, swap) (§4.1); False: execution + swap."""

    def __post_init__(self) -> None:
        if self.batch_base < 1:
            raise ValueError("batch_base must be >= 1")
        if self.batch_max is not None and self.batch_max < self.batch_base:
            raise ValueError("batch_max must be >= batch_base")
        if self.prefill_tokens is not None and self.prefill_tokens < 1:
            raise ValueError("prefill_tokens must be >= 1")
        if not 0 < self.t_avg_alpha <= 1:
            raise ValueError("t_avg_alpha must be in (0, 1]")
        if self.preemption_mode is not None:
            object.__setattr__(self, "preemption_mode", PreemptionMode(self.preemption_mode))
        if self.order not in ("fcfs", "priority", "input", "output"):
            raise ValueError(f"order must be fcfs, priority, input or output, got {self.order!r}")
        if not 0 <= self.watermark < 1:
            raise ValueError("watermark must be in [0, 1)")


# --------------------------------------------------------------------------- estimates
class _Cost:
    """The batch's :class:`BatchStats`, kept incrementally so that adding or removing a
    candidate and re-pricing is O(1)."""

    __slots__ = ("cm", "ctx", "n_decode", "n_pf_seqs", "overlap", "pf_tokens", "swap", "work")

    def __init__(self, cm: CostModel, overlap: bool) -> None:
        self.cm = cm
        self.overlap = overlap
        self.pf_tokens = self.n_pf_seqs = self.work = self.n_decode = self.ctx = self.swap = 0

    def add(self, r: Request, n: int, swap_tokens: int, sign: int = 1) -> None:
        if _is_decode(r):
            self.n_decode += sign
            self.ctx += sign * r.num_computed_tokens
        else:
            self.pf_tokens += sign * n
            self.n_pf_seqs += sign
            self.work += sign * n * (n + r.num_computed_tokens)
        self.swap += sign * swap_tokens

    def time(self, r: Request | None = None, n: int = 0, swap_tokens: int = 0) -> float:
        """The batch's time, with ``r`` processing ``n`` tokens added when given."""
        pf, seqs, work, dec, ctx = (
            self.pf_tokens,
            self.n_pf_seqs,
            self.work,
            self.n_decode,
            self.ctx,
        )
        if r is not None:
            if _is_decode(r):
                dec += 1
                ctx += r.num_computed_tokens
            else:
                pf += n
                seqs += 1
                work += n * (n + r.num_computed_tokens)
        ex = self.cm.batch_time(
            BatchStats(
                num_prefill_tokens=pf,
                num_prefill_seqs=seqs,
                prefill_attn_work=work,
                num_decode=dec,
                decode_context_sum=ctx,
            )
        )
        sw = self.cm.swap_time(self.swap + swap_tokens)
        return max(ex, sw) if self.overlap else ex + sw


def _transfer_in(kv: KVCacheManager, r: Request) -> int:
    """KV tokens that come back from the CPU when ``r`` runs (eq. 5's M^cpu, in tokens): a
    swapped request's whole KV, else its lazily checkpointed slots (none on paged blocks)."""
    if r.status is _SWAPPED:
        return r.num_computed_tokens
    ckpt = getattr(kv, "checkpointed_tokens", None)
    return ckpt(r.req_id) if ckpt is not None else 0


def _is_decode(r: Request) -> bool:
    n_out = r.num_output_tokens
    return n_out > 0 and r.num_prompt_tokens + n_out - r.num_computed_tokens == 1


# --------------------------------------------------------------------------- memory
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


# --------------------------------------------------------------------------- policy
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


class BROSScheduler(Scheduler):
    """Algorithm 1 with adaptive batch sizing; see the module docstring."""

    def __init__(self, config: BROSConfig | None = None, name: str = "bros") -> None:
        self.config = config or BROSConfig()
        self.name = name
        self.chunked_prefill = self.config.chunked_prefill
        self.default_prefill_tokens = self.config.prefill_tokens
        self.overlap_swap = self.config.overlap_swap
        self.drop_mode = self.config.preemption_mode or (
            PreemptionMode.SWAP if self.config.bidirectional else PreemptionMode.RECOMPUTE
        )
        self.batch_size = self.config.batch_base
        """B_curr."""
        self.t_avg: float | None = None
        self._last_start: float | None = None
        self._iters_seen = 0
        self.predicted_misses = 0
        """Iterations whose RT loop stopped on the time check (B_curr backed off)."""

    def describe(self) -> dict[str, object]:
        d: dict[str, object] = {"name": self.name}
        d.update(dataclasses.asdict(self.config))
        return d

    def max_sequence_tokens(self, limits: Limits) -> int:
        if self.config.chunked_prefill:
            return limits.kv_capacity_tokens
        # A (re)fill runs whole: it must fit one batch.
        return min(limits.max_prefill_tokens, limits.max_batch_tokens, limits.kv_capacity_tokens)

    def make_kv(self, limits: Limits, cpu_swap_blocks: int) -> KVCacheManager | None:
        if not self.config.bidirectional:
            return None
        return BidirectionalKVManager(
            limits.kv_capacity_tokens // limits.block_size, limits.block_size, cpu_swap_blocks
        )

    # ------------------------------------------------------------------ timing
    def _update_t_avg(self, view: InstanceView) -> float:
        ends = view.iter_end
        if self._last_start is not None and len(ends) > self._iters_seen:
            d = (ends[-1] - self._last_start) / (len(ends) - self._iters_seen)
            a = self.config.t_avg_alpha
            self.t_avg = d if self.t_avg is None else (1 - a) * self.t_avg + a * d
        self._iters_seen = len(ends)
        if self.t_avg is None:
            return view.cost_model.decode_time(1, 1)
        return self.t_avg

    def _k(self, r: Request, p: int) -> int:
        if not self.config.chunked_prefill or _is_decode(r):
            return 1
        return max(1, -(-r.remaining_compute // p))

    # ------------------------------------------------------------------ ranking
    def _rt_order(
        self, view: InstanceView, now: float, t_avg: float
    ) -> tuple[Iterator[_Cand], list[_Cand], float]:
        """RT candidates most urgent first (Figure 8's partial sort + merge), the sorted
        list of the others for T_min^res, and T_min^res."""
        p = view.limits.max_prefill_tokens
        ends = view.iter_end
        fresh: list[_Cand] = []
        others: list[_Cand] = []
        rt = RequestClass.RT

        def res(r: Request) -> float:
            slo = r.slo
            if r.num_output_tokens == 0 or not r.token_runs:
                target, since = slo.ttft_s, r.arrival
            else:
                target, since = slo.tpot_s, ends[r.token_runs[-1]]
            if target is None:
                return _INF
            return target - (now - since) - (self._k(r, p) - 1) * t_avg

        for r in view.waiting:
            if r.req_class is rt:
                c = _Cand(r, res(r))
                # Never-started requests of one TTFT target are already in residual order.
                (
                    fresh if r.num_output_tokens == 0 and r.num_computed_tokens == 0 else others
                ).append(c)
        for q in (view.running, view.swapped):
            for r in q:
                if r.req_class is rt:
                    others.append(_Cand(r, res(r)))
        others.sort(key=lambda c: (c.residual, c.req.arrival, c.req.req_id))
        if any(
            fresh[i].residual > fresh[i + 1].residual for i in range(len(fresh) - 1)
        ):  # mixed TTFT targets: the arrival order is not the residual order
            fresh.sort(key=lambda c: (c.residual, c.req.arrival, c.req.req_id))
        t_min = _INF
        for lst in (fresh, others):
            for c in lst:
                if c.residual > 0:
                    t_min = min(t_min, c.residual)
                    break
        merged = heapq.merge(fresh, others, key=lambda c: (c.residual, c.req.arrival, c.req.req_id))
        return merged, others, t_min

    def _be_order(self, view: InstanceView) -> list[Request]:
        kv = view.kv
        cpu_blocks = getattr(kv, "checkpointed_blocks", None)
        be = RequestClass.BE
        order = self.config.order
        pred = view.predictor

        def tie(r: Request) -> tuple[float, float]:
            if order == "priority":
                return (r.priority, r.arrival)
            if order == "input":
                return (r.num_prompt_tokens, r.arrival)
            if order == "output":
                return (pred.predict(r), r.arrival)
            return (r.arrival, 0.0)

        keyed: list[tuple[int, int, tuple[float, float], int, Request]] = []
        for q in (view.running, view.swapped, view.waiting):
            for r in q:
                if r.req_class is not be:
                    continue
                if r.status is _SWAPPED:
                    m = kv.swap_in_blocks_needed(r.req_id)
                elif cpu_blocks is not None:
                    m = cpu_blocks(r.req_id)
                else:
                    m = 0
                keyed.append((m, 0 if r.status is _RUNNING else 1, tie(r), r.req_id, r))
        keyed.sort(key=lambda t: t[:4])
        return [t[4] for t in keyed]

    # ------------------------------------------------------------------ sizing a candidate
    def _size(self, r: Request, budget_c: int, budget_p: int) -> int:
        """Tokens ``r`` processes now (0: it does not fit the token budgets)."""
        if _is_decode(r):
            return 1 if budget_c >= 1 else 0
        rem = r.remaining_compute
        room = min(budget_c, budget_p)
        if self.config.chunked_prefill:
            return min(rem, room)
        return rem if rem <= room else 0

    # ------------------------------------------------------------------ Algorithm 1
    def schedule(self, view: InstanceView) -> SchedulerOutput:
        cfg = self.config
        now = view.now
        lim = view.limits
        t_avg = self._update_t_avg(view)
        kv = view.kv
        plan_kw: dict[str, Any] = dict(
            bs=lim.block_size,
            free=kv.num_free_blocks,
            cpu_free=getattr(getattr(kv, "cpu", None), "free_blocks", 0),
            n_running=len(view.running),
            max_running=lim.max_running,
        )
        plan = (
            _SharedPlan(kv, **plan_kw)
            if isinstance(kv, BidirectionalKVManager)
            else _Plan(kv=kv, **plan_kw)
        )
        rt_iter, rt_others, t_min = self._rt_order(view, now, t_avg)
        d = _Decision(
            plan=plan,
            cost=_Cost(view.cost_model, cfg.overlap_swap),
            t_min=t_min,
            t_avg=t_avg,
            b_curr=self.batch_size,
            budget_c=lim.max_batch_tokens,
            budget_p=lim.max_prefill_tokens,
        )
        any_rt = missed = False
        for c in rt_iter:  # lines 5-15: the most urgent RT requests
            any_rt = True
            r = c.req
            if r.req_id in plan.gone:
                continue  # dropped for a more urgent request
            if len(d.rt_ready) >= d.b_curr:
                break
            n = self._size(r, d.budget_c, d.budget_p)
            if n == 0:
                break
            swap = _transfer_in(kv, r)
            if d.rt_ready and d.cost.time(r, n, swap) > t_min:
                missed = True
                break
            need = plan.need(r, n)
            if not plan.fits(r, need):
                before = len(plan.preempt)
                if not self._drop_for(view, d, r, need, c.residual, rt_others):
                    continue  # FindPreemptBlock failed even with dropping: skip it (see above)
                c.dropped = len(plan.preempt) > before
            c.n, c.need, c.swap_tokens = n, need, swap
            d.add(c, d.rt_ready)

        watermark = int(cfg.watermark * kv.num_blocks)
        be_order = self._be_order(view)
        self._pack_be(be_order, d, watermark)
        if not d.rt_ready and not d.be_ready and len(be_order) > 1:
            self._unjam(view, d, be_order, watermark)

        # Adaptive batch size (§4.2): back off on a predicted miss, grow while no RT.
        if missed:
            self.predicted_misses += 1
            self.batch_size = cfg.batch_base
        elif not any_rt and cfg.adaptive_batch:
            cap = cfg.batch_max or lim.max_running
            self.batch_size = max(cfg.batch_base, min(d.b_curr * 2, cap))

        chosen, swap_in = plan.finalize(
            [*d.rt_ready, *d.be_ready],
            [c.req for c in (*d.rt_ready, *d.be_ready) if c.req.status is _SWAPPED],
        )
        batch = tuple(ScheduledRequest(c.req, c.n) for c in chosen)
        self._last_start = now if batch or plan.preempt else None
        self._iters_seen = len(view.iter_end)
        return SchedulerOutput(batch, tuple(plan.preempt), tuple(swap_in))

    def _pack_be(self, be_order: list[Request], d: _Decision, watermark: int) -> None:
        """Algorithm 1 lines 16-33: pack BE requests, or let them replace RT requests."""
        plan = d.plan
        for r in be_order:
            if r.req_id in plan.gone or r.req_id in d.in_batch:
                continue
            n = self._size(r, d.budget_c, d.budget_p)
            swap = _transfer_in(plan.kv, r)
            need = plan.need(r, n) if n else 0
            if (
                n
                and len(d.rt_ready) + len(d.be_ready) < d.b_curr
                and d.cost.time(r, n, swap) <= d.t_min
            ):
                # The watermark only protects room for others: an idle replica admits.
                idle = plan.n_running == 0 and not d.in_batch
                reserve = watermark if r.status is not _RUNNING and not idle else 0
                if plan.fits(r, need, reserve):
                    d.add(_Cand(r, _INF, n, need, swap), d.be_ready)
                elif plan.reclaims:
                    # FindBlock failed. Unlike the size and time budgets, memory is not
                    # monotone over the BE order (each request needs different room):
                    # try replacing (it frees the RT request's blocks), else skip this one.
                    self._replace(r, d)
            elif not self._replace(r, d):
                break

    def _unjam(
        self, view: InstanceView, d: _Decision, be_order: list[Request], watermark: int
    ) -> None:
        """Nothing at all fits: BE requests wait for room that only other BE requests hold
        (e.g. partially checkpointed ones that cannot restore). Drop BE requests not in the
        batch, most checkpointed first, until another one can run; without this the replica
        would deadlock once no RT request is left to finish and free memory."""
        ckpt = getattr(view.kv, "checkpointed_tokens", None)
        gone = d.plan.gone
        victims = [
            r
            for r in reversed(view.running)
            if r.req_class is RequestClass.BE and r.req_id not in gone
        ]
        if ckpt is not None:
            victims.sort(key=lambda r: -ckpt(r.req_id))
        for v in victims[:-1]:  # keep one: a batch of preemptions only would be empty
            self._evict(d, v)
            self._pack_be(be_order, d, watermark)
            if d.be_ready:
                return

    def _replace(self, r: Request, d: _Decision) -> bool:
        """Algorithm 1 lines 40-53: swap the least urgent RT request of the batch for BE
        request ``r`` when that makes ``r`` fit; False (nothing changed) otherwise."""
        if not d.rt_ready:
            return False
        victim = d.rt_ready[-1]
        if victim.dropped:
            return False  # requests were evicted for it: a BE request must not take that room
        if self.config.replace_guard and victim.residual - d.cost.time() <= d.t_avg:
            return False  # it cannot afford to skip this iteration
        d.remove(victim, d.rt_ready)  # undo its share, then see whether r fits instead
        n = self._size(r, d.budget_c, d.budget_p)
        swap = _transfer_in(d.plan.kv, r)
        need = d.plan.need(r, n) if n else 0
        if (
            n
            and len(d.rt_ready) + len(d.be_ready) < d.b_curr
            and d.cost.time(r, n, swap) <= d.t_min
            and d.plan.fits(r, need)
        ):
            d.add(_Cand(r, _INF, n, need, swap), d.be_ready)
            return True
        d.add(victim, d.rt_ready)
        return False

    def _evict(self, d: _Decision, victim: Request) -> None:
        """Evict ``victim`` in the plan; a swap-out's tokens count in the batch's transfer
        time as the engine charges them."""
        kv = d.plan.kv
        out = getattr(kv, "gpu_tokens", kv.num_tokens)(victim.req_id)
        if d.plan.evict(victim, self.drop_mode) is PreemptionMode.SWAP:
            d.cost.swap += out

    def _drop_for(
        self,
        view: InstanceView,
        d: _Decision,
        cand: Request,
        need: int,
        residual: float,
        rt_sorted: list[_Cand],
    ) -> bool:
        """Progressive dropping (§5.2) to make room for RT request ``cand``: BE requests not
        in the batch (newest first), then less urgent RT requests (most residual first).
        Evicts only when evicting every eligible victim would make room."""
        plan, in_batch = d.plan, d.in_batch
        ckpt = getattr(view.kv, "checkpointed_tokens", None)
        victims: list[Request] = [
            r
            for r in reversed(view.running)
            if r.req_class is RequestClass.BE
            and r.req_id not in in_batch
            and r.req_id not in plan.gone
        ]
        if ckpt is not None:
            # Partially checkpointed BE requests first: they cannot run until their slots
            # come back, and dropping them frees CPU room for further lazy checkpoints.
            victims.sort(key=lambda r: -ckpt(r.req_id))
        rank = (residual, cand.arrival, cand.req_id)
        # Less urgent RT requests are dropped for a running candidate (to keep it going)
        # or a new one that can still make its TTFT, not for a dropped RT request coming
        # back (see ``literal_rt_drops``).
        drop_rt = (
            cand.status is _RUNNING
            or (cand.num_computed_tokens == 0 and cand.num_output_tokens == 0 and residual > 0)
            or self.config.literal_rt_drops
        )
        for c in reversed(rt_sorted) if drop_rt else ():
            r = c.req
            if (c.residual, r.arrival, r.req_id) <= rank:
                break  # everything left is at least as urgent as the candidate
            if (
                r.status is _RUNNING
                and r.req_id not in in_batch
                and r.req_id not in plan.gone
                and r is not cand
            ):
                victims.append(r)
        if not victims or not plan.room_after(cand, need, victims):
            return False
        for r in victims:
            if plan.fits(cand, need):
                return True
            self._evict(d, r)
        return plan.fits(cand, need)


def make_bros(params: Mapping[str, Any], name: str = "bros") -> Scheduler:
    """The registry factory: ``params`` override :class:`BROSConfig` fields."""
    fields = {f.name for f in dataclasses.fields(BROSConfig)}
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ConfigError(
            f"policy {name!r}: unknown parameter(s) {', '.join(unknown)}; "
            f"valid: {', '.join(sorted(fields))}"
        )
    p = dict(params)
    if p.get("preemption_mode") is not None:
        p["preemption_mode"] = PreemptionMode.parse(p["preemption_mode"], name)
    try:
        return BROSScheduler(BROSConfig(**p), name=name)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"policy {name!r}: {e}") from e
