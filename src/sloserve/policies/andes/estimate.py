"""One scheduling decision's view of its candidates (Andes §4.1): per request, the QoE
state, context length, KV weight and first-token delay, from which Q_serve at any token
latency τ(B) and the QoE loss of a delay (the refiner's, §4.3) are computed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from sloserve.core.request import Request
from sloserve.policies.andes.objectives import Objective, ObjectiveContext
from sloserve.policies.andes.qoe_predict import EPS, FloatArray, IntArray, new_tokens, qoe_end

RUNNING, SWAPPED, WAITING = 0, 1, 2


@dataclass
class Estimate:
    """Everything one decision knows about its candidates (index-aligned arrays).

    Candidates are ``view.running + view.swapped + view.waiting`` in that order, each in
    arrival order, so index order is also the tie-break order.
    """

    now: float
    t_end: float
    reqs: list[Request]
    kind: NDArray[np.int8]
    n: FloatArray
    a_last: FloatArray
    sum_a: FloatArray
    t1: FloatArray
    inv_s: FloatArray
    nxt: FloatArray
    """When each user wants its next token (``A_n + 1/s``, or ``T_1``)."""
    avail: FloatArray
    """Tokens each request may still generate (predicted)."""
    expect: FloatArray
    """Tokens the ideal timeline expects by ``t_end``."""
    length: IntArray
    """Context length l (prompt + generated tokens)."""
    blocks: IntArray
    """KV blocks the request holds once it has run one more step: the knapsack weight."""
    base_delay: FloatArray
    """Seconds before the first new token, excluding τ (prefill, swap-in)."""
    uses_tau: FloatArray
    """1 when the first new token also waits one decode step (running, swapped)."""
    restart: FloatArray
    """Restart overhead charged to an admission (refill or swap-in of a preempted one)."""
    objective: Objective
    ctx: ObjectiveContext
    v_wait: FloatArray
    tau: float = 0.0
    gain: FloatArray | None = None
    q_best: FloatArray | None = None
    """Q_serve at the chosen batch size."""

    @property
    def size(self) -> int:
        return len(self.reqs)

    def q_serve(
        self,
        tau: FloatArray | float,
        delay: FloatArray | float = 0.0,
        idx: IntArray | slice = slice(None),
    ) -> FloatArray:
        """Q_serve of the candidates ``idx`` with decode step ``tau``, every first token
        ``delay`` seconds later."""
        first = self.now + self.base_delay[idx] + self.uses_tau[idx] * tau + delay
        inv_s = self.inv_s[idx]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            k, s_new, l_new = new_tokens(
                self.nxt[idx], inv_s, self.avail[idx], self.t_end, first, tau
            )
            last = np.where(k > 0, l_new, self.a_last[idx])
            return qoe_end(
                self.n[idx] + k, self.sum_a[idx] + s_new, last, self.t1[idx], inv_s,
                self.expect[idx], self.t_end,
            )  # fmt: skip

    def subset(self, idx: IntArray) -> Estimate:
        """The estimate restricted to the candidates ``idx`` (arrays gathered once)."""
        sub = {
            f.name: getattr(self, f.name)[idx]
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), np.ndarray)
        }
        return dataclasses.replace(
            self,
            reqs=[self.reqs[i] for i in idx.tolist()],
            ctx=ObjectiveContext(self.ctx.q_now[idx], self.ctx.q_min),
            **sub,
        )

    def loss(self, overheads: FloatArray) -> FloatArray:
        """Σ over all candidates of the objective value lost when their tokens are delayed
        by each of the (non-decreasing) ``overheads`` (one total per overhead)."""
        out = np.zeros(overheads.size)
        if self.size == 0 or overheads.size == 0:
            return out
        obj = self.objective
        ctx = self.ctx
        v0 = obj.value(self.q_best if self.q_best is not None else self.q_serve(self.tau), ctx)
        if overheads.size <= 8:  # small: one 2-D pass is cheaper than filtering first
            delayed = obj.value(self.q_serve(self.tau, overheads[:, None]), ctx)
            return np.asarray((v0[None, :] - delayed).sum(axis=1), dtype=np.float64)
        # Value falls with the delay: who is not hurt by the largest one is never hurt.
        v_max = obj.value(self.q_serve(self.tau, float(overheads[-1])), ctx)
        hurt = np.flatnonzero(v_max < v0 - EPS)
        if hurt.size == 0:
            return out
        if overheads.size == 1:
            out[0] = float((v0 - v_max)[hurt].sum())
            return out
        ctx = ObjectiveContext(ctx.q_now[hurt], ctx.q_min)
        delayed = obj.value(self.q_serve(self.tau, overheads[:, None], hurt), ctx)
        return np.asarray((v0[hurt][None, :] - delayed).sum(axis=1), dtype=np.float64)
