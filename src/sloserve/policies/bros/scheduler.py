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
   (:attr:`overlap_swap`), is ``max(execution, swap)`` (§4.1: transfers are asynchronous;
   see :mod:`.cost`).

The orders of steps 1 and 2 (and Figure 8's request pulling) are in :mod:`.ranking`, the
memory and budgets a decision uses up in :mod:`.plan`.

KV memory: with ``bidirectional=True`` (policy ``bros``) the replica uses
:class:`~sloserve.engine.kv_bidirectional.BidirectionalKVManager` (via :meth:`make_kv`),
where an RT request takes over BE blocks and only the overwritten BE slots are
checkpointed. ``bidirectional=False`` (``bros-nobicache``, the §7.4.1 ablation) uses the
ordinary paged cache, and an RT request that finds no free block evicts others with
recompute ("we simply perform recomputation for requests failing to acquire cache blocks").

Choices where the paper is silent (parameters of :class:`BROSConfig` where they matter;
the orders' choices are in :mod:`.ranking`):

* The most urgent RT request always joins (a batch cannot be faster than one request): a
  batch is never empty for lack of time.
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
import math
from collections.abc import Mapping
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.core.request import Request, RequestClass, RequestStatus
from sloserve.engine.interface import (
    InstanceView,
    Limits,
    PreemptionMode,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)
from sloserve.engine.kv import KVCacheManager
from sloserve.engine.kv_bidirectional import BidirectionalKVManager
from sloserve.policies.bros.config import BROSConfig
from sloserve.policies.bros.cost import _Cost, _is_decode, _transfer_in
from sloserve.policies.bros.plan import _Cand, _Decision, _Plan, _SharedPlan
from sloserve.policies.bros.ranking import _Ranking

_INF = math.inf
_RUNNING = RequestStatus.RUNNING
_SWAPPED = RequestStatus.PREEMPTED_SWAPPED


class BROSScheduler(_Ranking, Scheduler):
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
