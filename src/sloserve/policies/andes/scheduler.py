"""Andes itself (Andes §4, Algorithms 1 and 2): per decision, the batch sizes B to try and
the knapsack of Equation 5 solved for each; the best set is executed by
:class:`~sloserve.policies.andes.qoe_scheduler.QoEScheduler`.

Choices where the paper is vague:

* **Batch size search.** ``B_max`` = the number of shortest-context requests that fit in M
  (capped by R_max, C and ``batch_max``); ``B_min`` = the largest B whose ``τ(B)`` still
  beats the most stringent reading speed (binary search; at least ``batch_min``). When
  ``B_min >= B_max`` only ``B_max`` is tried (the common case: decoding is much faster than
  reading); otherwise ``batch_candidates`` geometrically spaced sizes in
  ``[B_min, B_max]``; the best objective wins, ties to the larger B.
* **Greedy** follows Algorithm 1 literally: it stops at the first request (in priority
  order) that does not fit. Priority ties (e.g. every request with more than Δt of
  buffered tokens has gain 0) go to the shorter context (the paper wants long contexts
  preempted first), then to running, swapped, waiting requests, then to the earlier
  arrival.
* **DP** (``solver=dp``) solves at most B items (the best over all b <= B) with KV
  quantised to ``dp_memory_units`` units (weights rounded up: always feasible); it is
  ``O(N·B·units)`` per candidate B, so slow, as the paper says.

The solvers (greedy, DP, brute force) live beside this module in
:mod:`sloserve.policies.andes.knapsack`: they are the policy's own decision procedure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from sloserve.engine.interface import InstanceView, Scheduler, SchedulerOutput
from sloserve.policies.andes.config import AndesConfig, config_from_params
from sloserve.policies.andes.estimate import Estimate
from sloserve.policies.andes.knapsack import dp_pack, greedy_order, greedy_pack, quantize_weights
from sloserve.policies.andes.qoe_predict import BoolArray, IntArray
from sloserve.policies.andes.qoe_scheduler import QoEScheduler


class AndesScheduler(QoEScheduler):
    """Andes (see the module and package docstrings)."""

    def __init__(self, config: AndesConfig | None = None, name: str = "andes") -> None:
        cfg = config or AndesConfig()
        super().__init__(
            name,
            delta_t=cfg.delta_t,
            watermark=cfg.watermark,
            selective=cfg.selective,
            slot_trigger=cfg.slot_trigger,
            objective=cfg.objective,
            preemption_mode=cfg.preemption_mode,
            hybrid=cfg.hybrid,
            default_ttft_s=cfg.default_ttft_s,
            default_tokens_per_s=cfg.default_tokens_per_s,
        )
        self.config = cfg
        self.victim_gains = cfg.refiner_victim_gains

    # ------------------------------------------------------------------ decision
    def _decide(self, view: InstanceView, est: Estimate) -> SchedulerOutput:
        selected, order, b = self._solve(view, est)
        return self._execute(view, est, selected, order, b, self.config.refiner)

    def _candidates(self, view: InstanceView, est: Estimate) -> tuple[list[int], float]:
        """Batch sizes to try, and the mean context length τ(B) is priced with."""
        cfg = self.config
        _one, b_max, mean_len = self._batch_range(view, est)
        if cfg.batch_max is not None:
            b_max = min(b_max, cfg.batch_max)
        cm = view.cost_model
        need = float(est.inv_s.min())  # the most stringent user's seconds per token
        # B_min: the largest B whose token latency still beats every reader (binary search).
        lo, hi = 1, b_max
        if self._tau(cm, b_max, mean_len) <= need:
            lo = b_max
        else:
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._tau(cm, mid, mean_len) <= need:
                    lo = mid
                else:
                    hi = mid - 1
        b_min = max(lo, cfg.batch_min or 1)
        if b_min >= b_max:
            return [b_max], mean_len
        grid = np.rint(np.geomspace(b_min, b_max, max(2, cfg.batch_candidates)))
        return sorted({int(x) for x in grid.tolist()} | {b_min, b_max}), mean_len

    def _solve(self, view: InstanceView, est: Estimate) -> tuple[BoolArray, IntArray, int]:
        """The chosen set, the candidates in priority order (best first) and B."""
        cfg = self.config
        sizes, mean_len = self._candidates(view, est)
        if len(sizes) > 1:
            self.stats["batch_search"] += 1
        cm = view.cost_model
        taus = np.array([self._tau(cm, b, mean_len) for b in sizes])
        q_serve = est.q_serve(taus[:, None]) if len(sizes) > 1 else est.q_serve(taus[0])[None]
        gains = self.objective.value(q_serve, est.ctx) - est.v_wait[None, :]
        m = view.kv.num_blocks
        lens = est.length.astype(np.float64)
        # Priority ties: shorter context first (a long context is preempted first), then
        # running before swapped before waiting, then arrival (the candidates' index order).
        ties = np.argsort(est.length, kind="stable").astype(np.int64)
        if cfg.solver == "dp":
            w, cap = quantize_weights(est.blocks, m, cfg.dp_memory_units)
        best_val = -math.inf
        best: tuple[BoolArray, IntArray, int, int] | None = None
        for j, b in enumerate(sizes):
            g = gains[j]
            if cfg.solver == "greedy":
                sol = greedy_pack(g, est.blocks, m, b, lengths=lens, tie_order=ties)
                assert sol.order is not None
                sel, order, val = sol.selected, sol.order, sol.value
            else:
                sol = dp_pack(g, w, cap, b)
                sel, val = sol.selected, sol.value
                order = greedy_order(g, lens, ties)
            if val >= best_val - 1e-12:  # ties go to the larger batch
                best_val, best = val, (sel, order, b, j)
        assert best is not None
        sel, order, b, j = best
        est.gain = gains[j]
        est.tau = float(taus[j])
        est.q_best = q_serve[j]
        return sel, order, b


def make_andes(params: Mapping[str, Any]) -> Scheduler:
    """Registry factory: ``andes`` with :class:`AndesConfig` parameters."""
    cfg: AndesConfig = config_from_params(AndesConfig, "andes", params)
    return AndesScheduler(cfg)
