"""Andes' QoE prediction (Andes §4.1–4.2): the in-flight QoE of a request at ``now + Δt``
if it is served, or not, for the next Δt, in closed form, and the per-request consumption
state it is computed from (:class:`QoETracker`). The QoE itself is
:func:`sloserve.metrics.qoe.andes_qoe`; this module only predicts it.

Choice where the paper is vague:

* **QoE prediction.** Exact, not sampled: the policy keeps, per request, the Andes
  consumption state (tokens delivered ``n``, consumption time of the last one ``A_n``,
  ``Σ A_i``), updated incrementally from the tokens' real delivery times (the instance's
  iteration log ``view.iter_end`` indexed by ``Request.token_runs``). A served request is
  predicted to receive tokens at ``now + f_i + j·τ(B)`` (``f_i``: ``τ(B)`` when running,
  its (re)fill prefill when waiting, its swap-in plus ``τ(B)`` when swapped), capped at the
  predictor's remaining output; the pacer-limited consumption of such an arithmetic
  sequence has a closed form (:func:`predict_qoe`), so every request and every candidate
  B is evaluated in a few vectorised numpy operations. The in-flight QoE at ``now + Δt``
  is exactly :func:`~sloserve.metrics.qoe.andes_qoe` with ``now = now + Δt`` and
  ``total_tokens`` = the predicted output length (tests check the two agree).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from sloserve.core.predictor import OutputLengthPredictor
from sloserve.core.request import QoESpec, Request

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

EPS = 1e-9


def expected_tokens(
    t1: FloatArray, speed: FloatArray, total: FloatArray, t_end: float
) -> FloatArray:
    """Tokens the ideal timeline expects by ``t_end`` (capped at the output length)."""
    e = np.where(t_end >= t1, np.floor((t_end - t1) * speed + EPS) + 1.0, 0.0)
    return np.minimum(e, total)


def new_tokens(
    nxt: FloatArray,
    inv_s: FloatArray,
    avail: FloatArray,
    t_end: float,
    first: FloatArray | float,
    tau: FloatArray | float,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Tokens delivered at ``first + j·tau`` up to ``t_end`` (at most ``avail``), read by a
    user who wants the next token at ``nxt``: (count k, Σ of their consumption times, the
    last one's consumption time)."""
    first_a = np.asarray(first, dtype=np.float64)
    tau_a = np.asarray(tau, dtype=np.float64)
    span = t_end - first_a
    k = np.where(span >= 0, np.floor(span / tau_a + EPS) + 1.0, 0.0)
    k = np.minimum(k, avail)
    f = np.where(k > 0, first_a, 0.0)  # any finite value where no token comes
    km1 = k - 1.0
    # Tokens at least as fast as reading: the user reads them back to back from the first.
    a1 = np.maximum(f, nxt)
    sum_new = k * a1 + inv_s * (k * km1 * 0.5)
    last_new = a1 + km1 * inv_s
    d = tau_a - inv_s
    slow = d > 0
    if slow.any():
        # Slower than reading: the buffer lasts c tokens (the user reads at nxt + j/s),
        # then each token is read as it arrives.
        prev = nxt - inv_s
        c = np.where(slow, np.ceil((nxt - f) / np.where(slow, d, 1.0) - EPS), 0.0)
        c = np.minimum(k, np.maximum(c, 0.0))
        sum_gt = (
            c * prev
            + inv_s * (c * (c + 1.0) * 0.5)
            + (k - c) * f
            + tau_a * (km1 * k * 0.5 - (c - 1.0) * c * 0.5)
        )
        last_gt = np.where(k > c, f + km1 * tau_a, prev + k * inv_s)
        sum_new = np.where(slow, sum_gt, sum_new)
        last_new = np.where(slow, last_gt, last_new)
    return k, sum_new, last_new


def qoe_end(
    n2: FloatArray,
    sum2: FloatArray,
    last2: FloatArray,
    t1: FloatArray,
    inv_s: FloatArray,
    expect: FloatArray,
    t_end: float,
) -> FloatArray:
    """In-flight QoE at ``t_end`` from the delivered tokens' count, Σ A and last A: the
    expected but undelivered tokens count as read at ``max(t_end, A_last)``."""
    miss = np.maximum(expect - n2, 0.0)
    fill = np.maximum(t_end, last2)  # last2 is 0 when nothing was delivered
    ntot = n2 + miss
    sum_all = sum2 + miss * fill
    a_fin = np.where(miss > 0, fill, last2)
    sum_t = ntot * (t1 + inv_s * ((ntot - 1.0) * 0.5))
    whole = ntot * a_fin - sum_t
    delay = sum_all - sum_t
    pos = whole > 0
    q = np.where(pos, 1.0 - delay / np.where(pos, whole, 1.0), 1.0)
    return np.clip(q, 0.0, 1.0)


def predict_qoe(
    n: FloatArray,
    a_last: FloatArray,
    sum_a: FloatArray,
    t1: FloatArray,
    inv_s: FloatArray,
    total: FloatArray,
    t_end: float,
    first: FloatArray | float,
    tau: FloatArray | float,
) -> FloatArray:
    """In-flight Andes QoE at ``t_end`` of requests that have delivered ``n`` tokens (the
    last consumed at ``a_last``, ``Σ A = sum_a``) and will get new tokens at ``first``,
    ``first + tau``, ... (``first = inf``: none), at most ``total − n`` of them.

    ``t1`` is the ideal time of the first token (arrival + TTFT target) and ``inv_s`` the
    user's seconds per token. Every argument broadcasts (e.g. ``first`` and ``tau`` shaped
    ``(num_B, 1)`` against per-request ``(N,)`` arrays). Equals
    ``andes_qoe(arrival, delivered + new tokens, ttft, s, now=t_end, total_tokens=total)``.

    Closed form: with ``P = A_n`` (``T_1 − 1/s`` before the first token), new token j is
    read at ``max(P + j/s, max_{m<=j} d_m + (j−m)/s)``, an arithmetic series in each of
    the two regimes (delivery faster or slower than reading).
    """
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        nxt = np.where(n > 0, a_last + inv_s, t1)
        k, s_new, l_new = new_tokens(nxt, inv_s, np.maximum(total - n, 0.0), t_end, first, tau)
        expect = expected_tokens(t1, 1.0 / inv_s, total, t_end)
        return qoe_end(
            n + k, sum_a + s_new, np.where(k > 0, l_new, a_last), t1, inv_s, expect, t_end
        )


class QoETracker:
    """Per-request Andes consumption state, kept incrementally in numpy arrays (slots).

    A request gets a slot when the policy first sees it and loses it when it finishes.
    :meth:`sync` folds in the tokens delivered since the last call, at their real delivery
    times (the instance's iteration log), so that any number of fast-forwarded iterations
    between two decisions is accounted for exactly.
    """

    def __init__(self, default: QoESpec) -> None:
        self.default = default
        self.index: dict[int, int] = {}
        self._free: list[int] = []
        self._size = 0
        cap = 64
        self.n = np.zeros(cap, dtype=np.int64)
        self.a_last = np.zeros(cap)
        self.sum_a = np.zeros(cap)
        self.t1 = np.zeros(cap)
        self.inv_s = np.ones(cap)
        self.speed = np.ones(cap)
        self.prompt = np.zeros(cap, dtype=np.int64)
        self.total = np.ones(cap, dtype=np.int64)
        self.pf_len = np.full(cap, -1, dtype=np.int64)
        self.pf_time = np.zeros(cap)
        self.sw_len = np.full(cap, -1, dtype=np.int64)
        self.sw_time = np.zeros(cap)

    def _grow(self) -> None:
        cap = self.n.size * 2
        for name in (
            "n", "a_last", "sum_a", "t1", "inv_s", "speed", "prompt", "total", "pf_len",
            "pf_time", "sw_len", "sw_time",
        ):  # fmt: skip
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[: old.size] = old
            setattr(self, name, new)

    def _add(self, r: Request, predictor: OutputLengthPredictor) -> int:
        if self._free:
            s = self._free.pop()
        else:
            if self._size == self.n.size:
                self._grow()
            s = self._size
            self._size += 1
        spec = r.qoe or self.default
        self.index[r.req_id] = s
        self.n[s] = 0
        self.a_last[s] = 0.0
        self.sum_a[s] = 0.0
        self.t1[s] = r.arrival + spec.ttft_s
        self.inv_s[s] = 1.0 / spec.tokens_per_s
        self.speed[s] = spec.tokens_per_s
        self.prompt[s] = r.num_prompt_tokens
        self.total[s] = max(1, predictor.predict(r))
        self.pf_len[s] = -1
        self.sw_len[s] = -1
        # A request handed off by a prefill replica (disaggregated serving) arrives with
        # tokens emitted elsewhere: fold in their delivery times, one by one, as sync would.
        for d in r.streamed_times[: r.num_output_tokens]:
            prev = self.a_last[s] + self.inv_s[s] if self.n[s] > 0 else self.t1[s]
            self.a_last[s] = max(d, prev)
            self.sum_a[s] += self.a_last[s]
            self.n[s] += 1
        return s

    def release(self, req_id: int) -> None:
        s = self.index.pop(req_id, None)
        if s is not None:
            self._free.append(s)

    def slots(self, reqs: Sequence[Request], predictor: OutputLengthPredictor) -> IntArray:
        index = self.index
        got = [index.get(r.req_id, -1) for r in reqs]
        if -1 in got:
            for i, s in enumerate(got):
                if s == -1:
                    got[i] = self._add(reqs[i], predictor)
        return np.asarray(got, dtype=np.int64)

    def sync(
        self,
        running: Sequence[Request],
        iter_end: Sequence[float],
        predictor: OutputLengthPredictor,
    ) -> IntArray:
        """Fold in tokens the running requests received since the last call; their slots."""
        sl = self.slots(running, predictor)
        if not running:
            return sl
        nout = np.fromiter((r.num_output_tokens for r in running), np.int64, len(running))
        delta = nout - self.n[sl]
        if not delta.any():
            return sl
        one = np.flatnonzero(delta == 1)
        if one.size:
            d = np.fromiter(
                (iter_end[running[i].token_runs[-1]] for i in one.tolist()), np.float64, one.size
            )
            s = sl[one]
            prev = np.where(self.n[s] > 0, self.a_last[s] + self.inv_s[s], self.t1[s])
            a = np.maximum(d, prev)
            self.a_last[s] = a
            self.sum_a[s] += a
            self.n[s] += 1
        for i in np.flatnonzero(delta > 1).tolist():
            self._absorb(running[i], int(sl[i]), int(delta[i]), iter_end)
        return sl

    def _absorb(self, r: Request, s: int, k: int, iter_end: Sequence[float]) -> None:
        """Fold in the last ``k`` tokens of ``r``, one by one (the same floating-point
        operations as ``k`` single updates, so fast-forwarded runs change nothing)."""
        runs = r.token_runs
        parts: list[Sequence[float]] = []
        need = k
        i = len(runs) - 2
        while need > 0 and i >= 0:
            start, end = runs[i], runs[i + 1]
            take = min(end - start + 1, need)
            parts.append(iter_end[end - take + 1 : end + 1])
            need -= take
            i -= 2
        inv_s = float(self.inv_s[s])
        n = int(self.n[s])
        a = float(self.a_last[s])
        total = float(self.sum_a[s])
        for part in reversed(parts):
            for d in part:
                a = max(d, a + inv_s) if n else max(d, float(self.t1[s]))
                total += a
                n += 1
        self.a_last[s] = a
        self.sum_a[s] = total
        self.n[s] = n

    def retain(self, keep: set[int]) -> None:
        """Forget requests that left without finishing here (aborted, migrated)."""
        for rid in [rid for rid in self.index if rid not in keep]:
            self.release(rid)
