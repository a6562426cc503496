"""The machinery Andes and its LQSF baseline share (Andes §4.2–4.3): QoE tracking, selective
triggering, the per-decision estimates, and the execution of a chosen set (preemptions,
swap-ins, the overhead-aware refiner) as a SchedulerOutput. The subclass only chooses the
set (:meth:`QoEScheduler._decide`).

Choices where the paper is vague:

* **Token latency** ``τ(B)`` is the cost model's decode time for B requests whose context
  sum is B × the mean context length of the live requests (appendix B: batch size and
  total context are nearly perfectly correlated).
* **Selective triggering.** The knapsack runs only when (a) KV occupancy is at or above
  ``watermark`` (default 90%); or (b) the running requests fill ``watermark`` of R_max
  (``slot_trigger``; our generalisation, off by default for Andes because it thrashes: see
  :mod:`~sloserve.policies.andes.config`); or (c) the
  current token latency exceeds ``1 / s_max`` (the most stringent reading speed); or (d)
  a request Andes preempted is still waiting or swapped (so that a FCFS pass never undoes
  Andes' preemptions). Otherwise the decision is vLLM's FCFS (a :class:`UnifiedScheduler`
  with the ``vllm`` preset's configuration); ``selective=False`` always runs the knapsack.
  The fallback's fast path (``repeatable``) is kept only while nothing waits and only up to
  the KV watermark, so fast-forwarded runs decide exactly as single steps would.
* **Executing a decision.** Running requests outside the chosen set are *victims*, taken
  lowest priority first, only as needed to make room (KV blocks and R_max slots) for an
  admission; a running request neither chosen nor needed as a victim keeps its KV and
  still decodes while the batch has fewer than B decodes. Admissions (chosen waiting or
  swapped requests) go in priority order; a (re)fill that does not fit this iteration's
  C / P budget waits for the next iteration without evicting anyone. Without hybrid
  batching (``hybrid=False``, as the vllm baseline) an iteration that admits a prompt runs
  only prefills, as vLLM v0 does.
* **Preemption mode.** ``auto`` (default): per victim, swap if the CPU tier has room and a
  swap round trip (out now, in later: ``2·swap_time``) costs less than the recompute
  (the refill prefill of prompt + generated tokens), else recompute.
* **Overhead-aware refiner.** Admissions are walked in priority order; each is paired with
  the lowest-priority victims that barely make room for it. The pair's overhead is the
  victims' preemption cost (the full round trip of the cheaper mechanism, charged when
  the preemption is decided) plus the admitted request's own restart cost when it was
  preempted before (refill prefill or swap-in; a new request's first prefill is ordinary
  work, not overhead). The QoE loss of a cumulative overhead ``O`` is Σ over the running
  requests that keep decoding of ``value(Q_serve,j) − value(Q_serve,j delayed by O)``
  (Q_wait's estimate with Δt replaced by the overhead, as §4.3 says, measured against the
  served prediction). The pair's net QoE change is its admission's gain minus that loss
  and minus the gains its victims give up (``refiner_victim_gains``; the paper's "net QoE
  change" of the set of decisions). A pair with victims is kept only if its net change is
  positive; an admission into free room only if it is not negative, and always while KV
  occupancy is below the watermark (work conservation: vLLM would admit it too). The first
  pair that fails cancels the rest, as in the paper. Pairs are built lazily, in growing
  chunks, and a chunk whose pairs all beat its total loss needs no per-pair evaluation.
* ``repeatable`` is False whenever Andes decides (its decisions depend on time); the vLLM
  fallback keeps its fast path only while nothing waits.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import numpy as np

from sloserve.core.request import QoESpec, Request
from sloserve.costmodel.base import CostModel
from sloserve.engine.interface import (
    InstanceView,
    Limits,
    PreemptionMode,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)
from sloserve.policies.andes.config import ModeName
from sloserve.policies.andes.estimate import RUNNING, SWAPPED, WAITING, Estimate
from sloserve.policies.andes.objectives import OBJECTIVES, Objective, ObjectiveContext
from sloserve.policies.andes.packer import Packer, Pair
from sloserve.policies.andes.qoe_predict import (
    EPS,
    BoolArray,
    IntArray,
    QoETracker,
    expected_tokens,
    qoe_end,
)
from sloserve.policies.infermax.unified import UnifiedConfig, UnifiedScheduler


def _fallback_config(mode: ModeName) -> UnifiedConfig:
    """The registry's ``vllm`` preset (prefill priority, no hybrid, no chunking)."""
    pm = PreemptionMode.SWAP if mode == "swap" else PreemptionMode.RECOMPUTE
    return UnifiedConfig("prefill-first", hybrid=False, chunked_prefill=False, preemption_mode=pm)


class QoEScheduler(Scheduler):
    """Shared machinery of the QoE-driven policies (Andes, LQSF): the QoE tracker, the
    per-decision estimates and the execution of a chosen set as a SchedulerOutput."""

    def __init__(
        self,
        name: str,
        *,
        delta_t: float,
        watermark: float,
        selective: bool,
        slot_trigger: bool,
        objective: str,
        preemption_mode: ModeName,
        hybrid: bool,
        default_ttft_s: float,
        default_tokens_per_s: float,
    ) -> None:
        self.name = name
        self.delta_t = delta_t
        self.watermark = watermark
        self.selective = selective
        self.slot_trigger = slot_trigger
        self.objective: Objective = OBJECTIVES[objective]()
        self.mode: ModeName = preemption_mode
        self.hybrid = hybrid
        self.tracker = QoETracker(QoESpec(default_ttft_s, default_tokens_per_s))
        self.fallback = UnifiedScheduler("vllm", _fallback_config(preemption_mode))
        self.default_prefill_tokens = self.fallback.default_prefill_tokens
        self.chunked_prefill = self.fallback.chunked_prefill
        self.stats: dict[str, int] = {
            "decisions": 0,
            "triggered": 0,
            "refiner_cut": 0,
            "batch_search": 0,
        }
        self._victim_costs: dict[int, tuple[float, float]] = {}
        self._cpu_free = 0
        self.victim_gains = False
        self._pf_memo: dict[int, float] = {}
        self._pf_model: CostModel | None = None

    def max_sequence_tokens(self, limits: Limits) -> int:
        return self.fallback.max_sequence_tokens(limits)

    def on_finish(self, req: Request, now: float) -> None:
        self.tracker.release(req.req_id)
        self.fallback.on_finish(req, now)

    # ------------------------------------------------------------------ trigger
    def _triggered(self, view: InstanceView, run_slots: IntArray) -> bool:
        if not self.selective:
            return True
        if view.swapped:
            return True
        kv = view.kv
        if kv.num_used_blocks >= self.watermark * kv.num_blocks:
            return True
        lim = view.limits
        running = view.running
        if self.slot_trigger and view.waiting and len(running) >= self.watermark * lim.max_running:
            return True
        tr = self.tracker
        if view.waiting:
            w_sl = tr.slots(view.waiting, view.predictor)
            if bool((tr.n[w_sl] > 0).any()):
                return True  # a request Andes preempted still waits
        if running:
            sl = run_slots
            ctx = int((tr.prompt[sl] + tr.n[sl]).sum())
            tau = view.cost_model.decode_time(len(running), ctx)
            live = np.concatenate([sl, tr.slots(view.waiting, view.predictor)])
            if tau > float(tr.inv_s[live].min()):
                return True
        return False

    # ------------------------------------------------------------------ estimates
    def _prefill_time(self, cm: CostModel, tokens: int) -> float:
        """``cm.prefill_time``, memoised (lengths repeat; the cost model is the replica's)."""
        if cm is not self._pf_model:
            self._pf_model = cm
            self._pf_memo.clear()
        t = self._pf_memo.get(tokens)
        if t is None:
            t = self._pf_memo[tokens] = cm.prefill_time(tokens)
        return t

    def _tau(self, cm: CostModel, b: int, mean_len: float) -> float:
        return cm.decode_time(b, int(b * mean_len)) if b > 0 else 0.0

    def _estimate(self, view: InstanceView, run_slots: IntArray | None = None) -> Estimate:
        tr = self.tracker
        reqs = [*view.running, *view.swapped, *view.waiting]
        if run_slots is None or run_slots.size != len(view.running):
            sl = tr.slots(reqs, view.predictor)
        else:
            rest = tr.slots([*view.swapped, *view.waiting], view.predictor)
            sl = np.concatenate([run_slots, rest])
        if len(tr.index) > 2 * len(reqs) + 256:
            tr.retain({r.req_id for r in reqs})
        n_run, n_swp, n_wait = len(view.running), len(view.swapped), len(view.waiting)
        kind = np.repeat(
            np.array([RUNNING, SWAPPED, WAITING], dtype=np.int8), [n_run, n_swp, n_wait]
        )
        n_i = tr.n[sl]
        length = tr.prompt[sl] + n_i
        blocks = -(-length // view.limits.block_size)
        n = n_i.astype(np.float64)
        total = np.maximum(tr.total[sl], n_i + 1).astype(np.float64)
        cm = view.cost_model
        base = np.zeros(len(reqs))
        restart = np.zeros(len(reqs))
        if n_swp:
            s_sl = sl[n_run : n_run + n_swp]
            s_len = length[n_run : n_run + n_swp]
            for j in np.flatnonzero(tr.sw_len[s_sl] != s_len).tolist():
                slot = int(s_sl[j])
                tr.sw_len[slot] = int(s_len[j])
                tr.sw_time[slot] = cm.swap_time(int(s_len[j]) - 1)
            base[n_run : n_run + n_swp] = restart[n_run : n_run + n_swp] = tr.sw_time[s_sl]
        if n_wait:
            w0 = n_run + n_swp
            w_sl = sl[w0:]
            w_len = length[w0:]
            stale = np.flatnonzero(tr.pf_len[w_sl] != w_len)
            for j in stale.tolist():  # new arrivals and newly preempted requests only
                slot = int(w_sl[j])
                tr.pf_len[slot] = int(w_len[j])
                tr.pf_time[slot] = self._prefill_time(cm, int(w_len[j]))
            base[w0:] = tr.pf_time[w_sl]
            restart[w0:] = np.where(n_i[w0:] > 0, base[w0:], 0.0)
        now = view.now
        t_end = now + self.delta_t
        a_last, sum_a, t1, inv_s = tr.a_last[sl], tr.sum_a[sl], tr.t1[sl], tr.inv_s[sl]
        speed = tr.speed[sl]
        nxt = np.where(n_i > 0, a_last + inv_s, t1)
        expect = expected_tokens(t1, speed, total, t_end)
        q_wait = qoe_end(n, sum_a, a_last, t1, inv_s, expect, t_end)
        obj = self.objective
        if obj.needs_current and reqs:
            q_now = qoe_end(
                n, sum_a, a_last, t1, inv_s, expected_tokens(t1, speed, total, now), now
            )
            ctx = ObjectiveContext(q_now, float(q_now.min()))
        else:
            ctx = ObjectiveContext(np.ones(len(reqs)), 1.0)
        return Estimate(
            now, t_end, reqs, kind, n, a_last, sum_a, t1, inv_s, nxt, total - n, expect,
            length, blocks, base, (kind != WAITING).astype(np.float64), restart, obj, ctx,
            obj.value(q_wait, ctx),
        )  # fmt: skip

    def _batch_range(self, view: InstanceView, est: Estimate) -> tuple[int, int, float]:
        """(B_min, B_max, mean context length) by the paper's pruning."""
        lim = view.limits
        fit = int(np.searchsorted(np.cumsum(np.sort(est.blocks)), view.kv.num_blocks, "right"))
        b_max = max(1, min(fit, lim.max_running, est.size, lim.max_batch_tokens))
        return 1, b_max, float(est.length.mean()) if est.size else 0.0

    # ------------------------------------------------------------------ execution
    def _victim_mode(
        self, view: InstanceView, r: Request, blocks: int, cpu_free: int
    ) -> tuple[PreemptionMode, float]:
        """The preemption mechanism for ``r`` and its round-trip cost (seconds)."""
        costs = self._victim_costs.get(r.req_id)
        if costs is None:
            recompute = self._prefill_time(
                view.cost_model, r.num_prompt_tokens + r.num_output_tokens
            )
            swap = math.inf
            if self.mode != "recompute":
                swap = 2.0 * view.cost_model.swap_time(view.kv.num_tokens(r.req_id))
            costs = self._victim_costs[r.req_id] = (recompute, swap)
        recompute, swap = costs
        if self.mode == "recompute" or blocks > cpu_free:
            return PreemptionMode.RECOMPUTE, recompute
        if self.mode == "swap" or swap < recompute:
            return PreemptionMode.SWAP, swap
        return PreemptionMode.RECOMPUTE, recompute

    def _execute(
        self,
        view: InstanceView,
        est: Estimate,
        selected: BoolArray,
        order: IntArray,
        b_cap: int,
        refiner: bool,
    ) -> SchedulerOutput:
        """Turn the chosen set into preemptions, swap-ins and a batch (see the module
        docstring, "Executing a decision" and "Overhead-aware refiner"). ``order`` lists
        the candidates best first."""
        self._victim_costs.clear()
        lim = view.limits
        kv = view.kv
        reqs = est.reqs
        kind = est.kind
        cpu = getattr(kv, "cpu", None)
        self._cpu_free = int(cpu.free_blocks) if cpu is not None else 0
        b_cap = max(1, min(b_cap, lim.max_batch_tokens))

        is_run = kind[order] == RUNNING
        chosen = selected[order]
        keep: list[int] = order[is_run & chosen].tolist()  # chosen running, best first
        pool: list[int] = order[is_run & ~chosen][::-1].tolist()  # victims, lowest first
        admits: list[int] = order[~is_run & chosen].tolist()  # chosen waiting / swapped

        preempt: list[tuple[Request, PreemptionMode]] = []
        evicted: set[int] = set()
        freed = 0

        def evict(i: int) -> None:
            nonlocal freed
            r = reqs[i]
            blocks = kv.num_request_blocks(r.req_id)
            mode, _cost = self._victim_mode(view, r, blocks, self._cpu_free)
            if mode is PreemptionMode.SWAP:
                self._cpu_free -= blocks
            preempt.append((r, mode))
            evicted.add(i)
            freed += blocks

        prefill_idx: list[int] = []
        decoders: list[int] = []
        for i in keep:
            (decoders if reqs[i].remaining_compute == 1 else prefill_idx).append(i)
        paused = decoders[b_cap:][::-1]  # chosen but beyond B: they hold KV, do not grow
        del decoders[b_cap:]
        growth = kv.decode_blocks_needed([reqs[i].req_id for i in decoders]) + sum(
            kv.blocks_needed(reqs[i].req_id, reqs[i].remaining_compute) for i in prefill_idx
        )
        while kv.num_free_blocks + freed < growth:  # memory ran out: evict, lowest rank first
            if pool:
                evict(pool.pop(0))
            elif paused:
                evict(paused.pop(0))
            elif decoders:
                i = decoders.pop()
                growth -= kv.decode_blocks_needed([reqs[i].req_id])
                evict(i)
            else:
                break
        pf_tokens = sum(reqs[i].remaining_compute for i in prefill_idx)
        packer = Packer(
            kv,
            est,
            admits,
            pool,
            avail=kv.num_free_blocks + freed - growth,
            slots=lim.max_running - len(view.running) + len(preempt),
            budget_c=lim.max_batch_tokens - (len(decoders) if self.hybrid else 0) - pf_tokens,
            budget_p=lim.max_prefill_tokens - pf_tokens,
        )
        if refiner:
            accepted = self._refine(view, est, packer, decoders)
        else:
            accepted = list(iter(packer.next, None))

        prefills: list[ScheduledRequest] = [
            ScheduledRequest(reqs[i], reqs[i].remaining_compute) for i in prefill_idx
        ]
        swap_in: list[Request] = []
        for a, vict, tok, need in accepted:
            for v in vict:
                evict(v)
            growth += need
            if kind[a] == WAITING:
                prefills.append(ScheduledRequest(reqs[a], tok))
            else:
                swap_in.append(reqs[a])

        if prefills and not self.hybrid:
            return SchedulerOutput(tuple(prefills), tuple(preempt), tuple(swap_in))
        # Unchosen running requests keep decoding while the batch has room under B (and C).
        avail = kv.num_free_blocks + freed - growth
        tokens = len(decoders) + len(swap_in) + sum(p.num_tokens for p in prefills)
        room = min(b_cap - len(decoders) - len(swap_in), lim.max_batch_tokens - tokens)
        if room > 0 and pool:
            position = np.empty(est.size, dtype=np.int64)
            position[order] = np.arange(est.size)
            for i in sorted(pool, key=lambda i: position[i]):  # best first
                if room <= 0:
                    break
                if i in evicted or reqs[i].remaining_compute != 1:
                    continue
                g = kv.blocks_needed(reqs[i].req_id, 1)
                if g > avail:
                    continue
                avail -= g
                decoders.append(i)
                room -= 1
        batch = [ScheduledRequest(reqs[i], 1) for i in decoders]
        batch += [ScheduledRequest(r, 1) for r in swap_in]
        batch += prefills
        return SchedulerOutput(tuple(batch), tuple(preempt), tuple(swap_in))

    def _refine(
        self, view: InstanceView, est: Estimate, packer: Packer, ongoing: list[int]
    ) -> list[Pair]:
        """The overhead-aware refiner: the prefix of the admission/preemption pairs (in
        priority order) to implement. Pairs are built lazily, in growing chunks, because
        the first pair that does not pay for itself cancels the rest."""
        kv = view.kv
        reqs = est.reqs
        gains = est.gain if est.gain is not None else np.zeros(est.size)
        # Below the KV watermark an admission into free room is what vLLM would do anyway
        # (work conservation); under memory pressure it must not hurt the running requests.
        free_ok = kv.num_used_blocks < self.watermark * kv.num_blocks
        running = est.subset(np.asarray(ongoing, dtype=np.int64))
        accepted: list[Pair] = []
        cpu_free = self._cpu_free
        o_prev = l_prev = 0.0
        chunk = 4
        while True:
            pairs = list(itertools.islice(iter(packer.next, None), chunk))
            if not pairs:
                return accepted
            chunk *= 2
            overheads = np.empty(len(pairs))
            for k, (a, vict, _tok, _need) in enumerate(pairs):
                cost = float(est.restart[a])
                for v in vict:
                    blocks = kv.num_request_blocks(reqs[v].req_id)
                    mode, c = self._victim_mode(view, reqs[v], blocks, cpu_free)
                    if mode is PreemptionMode.SWAP:
                        cpu_free -= blocks
                    cost += c
                overheads[k] = cost
            if self.victim_gains:
                net = np.array([gains[a] - float(gains[vict].sum()) for a, vict, _t, _n in pairs])
            else:
                net = gains[[a for a, _v, _t, _n in pairs]].astype(np.float64)
            has_victims = np.array([bool(vict) for _a, vict, _t, _n in pairs])
            checked = has_victims | (not free_ok)
            cum = o_prev + np.cumsum(overheads)
            k0 = 0
            if len(pairs) > 8:
                l_end = float(running.loss(cum[-1:])[0])
                # Every marginal loss in the chunk is at most the chunk's total.
                bound = l_end - l_prev
                ok = np.where(has_victims, net - bound > EPS, net - bound >= -EPS) | ~checked
                if ok.all():
                    accepted += pairs
                    o_prev, l_prev = float(cum[-1]), l_end
                    continue
                k0 = int(np.argmin(ok))
            exact = running.loss(np.concatenate(([o_prev], cum)))
            exact[0] = l_prev
            marginal = np.diff(exact)
            cut = len(pairs)
            for k in range(k0, len(pairs)):
                d = net[k] - marginal[k]
                # A preemption must pay for itself; an admission into free room must not hurt.
                if checked[k] and ((d <= EPS) if has_victims[k] else (d < -EPS)):
                    cut = k
                    break
            accepted += pairs[:cut]
            if cut < len(pairs):
                self.stats["refiner_cut"] += 1
                packer.cancel(pairs[cut:])
                return accepted
            o_prev, l_prev = float(cum[-1]), float(exact[-1])

    config: Any
    """The policy's frozen config dataclass (reported by :meth:`describe`)."""

    def describe(self) -> dict[str, object]:
        d: dict[str, object] = {"name": self.name}
        d.update(dataclasses.asdict(self.config))
        return d

    def schedule(self, view: InstanceView) -> SchedulerOutput:
        """Track QoE; when triggered, let the subclass decide on the estimates; otherwise
        (or with nothing to decide on) behave as vLLM."""
        self.stats["decisions"] += 1
        run_slots = self.tracker.sync(view.running, view.iter_end, view.predictor)
        if not self._triggered(view, run_slots):
            return self._delegate(view)
        self.stats["triggered"] += 1
        est = self._estimate(view, run_slots)
        if est.size == 0:
            return self._delegate(view)
        return self._checked(view, self._decide(view, est))

    def _decide(self, view: InstanceView, est: Estimate) -> SchedulerOutput:
        """The policy's own choice given this decision's estimates (extension point)."""
        raise NotImplementedError

    def _delegate(self, view: InstanceView) -> SchedulerOutput:
        """vLLM's decision. Its fast path is kept only while nothing waits, and only up to
        the KV watermark (``repeat_reserve_blocks``), so that a fast-forwarded run never
        crosses a point where this policy would have decided differently."""
        out = self.fallback.schedule(view)
        if not out.repeatable:
            return out
        if view.waiting or view.swapped:
            return dataclasses.replace(out, repeatable=False, repeat_reserve_blocks=0)
        kv = view.kv
        below = math.ceil(self.watermark * kv.num_blocks) - 1 - kv.num_used_blocks
        reserve = max(out.repeat_reserve_blocks, kv.num_free_blocks - max(below, 0))
        return dataclasses.replace(out, repeat_reserve_blocks=reserve)

    def _checked(self, view: InstanceView, out: SchedulerOutput) -> SchedulerOutput:
        """Never stall: when the plan runs no batch (it may only evict or swap, which the
        engine cannot price as an iteration), fall back to vLLM's decision."""
        if not out.batch and (view.running or view.waiting or view.swapped):
            fb = self.fallback.schedule(view)
            return dataclasses.replace(fb, repeatable=False, repeat_reserve_blocks=0)
        return out
