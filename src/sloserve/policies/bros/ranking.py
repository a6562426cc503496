"""Who goes first in a BROS decision (Algorithm 1's orders, §4.2): RT requests by residual
time to their next token's deadline, BE requests by checkpointed KV blocks.

Request pulling (Figure 8): instead of sorting all RT requests, the never-started waiting
RT requests are already in residual order (same TTFT target, arrival order), so only the
others (pending, swapped, recompute-preempted) are sorted and the two ordered streams are
merged lazily; the loop stops pulling as soon as the batch is decided.

Choices where the paper is silent:

* An RT request whose deadline has already passed still ranks first (most negative
  residual), but ``T_min^res`` is taken over requests that can still make it (residual
  > 0); with none, no time cap applies, only ``B_curr``, C and P.
* Ties among BE requests (equal ``M_j^cpu``): pending ones (KV on the GPU) before new
  ones — the cheapest to continue first — then ``order`` (arrival by default).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator

from sloserve.core.request import Request, RequestClass, RequestStatus
from sloserve.engine.interface import InstanceView
from sloserve.policies.bros.config import BROSConfig
from sloserve.policies.bros.cost import _is_decode
from sloserve.policies.bros.plan import _Cand

_INF = math.inf
_RUNNING = RequestStatus.RUNNING
_SWAPPED = RequestStatus.PREEMPTED_SWAPPED


class _Ranking:
    """The ordering half of :class:`~sloserve.policies.bros.scheduler.BROSScheduler`."""

    config: BROSConfig

    def _k(self, r: Request, p: int) -> int:
        if not self.config.chunked_prefill or _is_decode(r):
            return 1
        return max(1, -(-r.remaining_compute // p))

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
            else:  # (a handed-off request's runs are a placeholder: Request says when)
                target, since = slo.tpot_s, r.last_token_time(ends)
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
