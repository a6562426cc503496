"""Andes: QoE-aware token-level preemptive scheduling (Andes §4, appendices A–C).

Every scheduling decision (one per iteration while Andes is triggered), for each live
request ``i`` (running, swapped or waiting) Andes estimates

* ``Q_serve,i(B)``: its QoE (:func:`sloserve.metrics.qoe.andes_qoe`, in flight) at
  ``now + Δt`` if it is served for the next Δt in a batch of size B;
* ``Q_wait,i``: its QoE at ``now + Δt`` if it gets no token in that time;
* its context length ``l_i`` (prompt + generated tokens; the KV it occupies),

and solves the knapsack of Equation 5 (gain ``Q_serve − Q_wait``, weight = KV blocks,
capacity M, at most B items) with Algorithm 1 (greedy by ``gain / l``) or Algorithm 2 (the
3D DP, :mod:`sloserve.optimal.knapsack`), over a pruned range of B. The overhead-aware
refiner (§4.3) then keeps only the admissions whose QoE gain beats the QoE loss their
preemption/restart overhead inflicts on the running requests.

Choices where the paper is vague (all parameters of :class:`AndesConfig`):

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
* **Token latency** ``τ(B)`` is the cost model's decode time for B requests whose context
  sum is B × the mean context length of the live requests (appendix B: batch size and
  total context are nearly perfectly correlated).
* **Δt** defaults to 1 s. The paper's Figure 19 finds QoE roughly flat in Δt with a
  workload-dependent best value, and so do we: on the cyclic-burst ShareGPT / Llama-2-7B
  scenario of ``tests/test_andes.py`` (16 req/s, R_max 1024, seed 0) mean QoE is 0.950,
  0.954, 0.951, 0.952, 0.949, 0.950 for Δt = 0.5, 1, 2, 3, 5, 10 s, while preemptions per
  request are lowest at 1 s (0.34 vs 1.36 at 2 s). At higher load (18 req/s) 2 s does
  better (mean over 5 seeds 0.951 vs 0.930): tune it per deployment, as the paper says.
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
* **Selective triggering.** The knapsack runs only when (a) KV occupancy is at or above
  ``watermark`` (default 90%); or (b) the running requests fill ``watermark`` of R_max
  (``slot_trigger``; our generalisation: R_max is capacity just as M is); or (c) the
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
* **Objectives** (appendix A) are value functions ``v(Q)`` with gain
  ``v(Q_serve) − v(Q_wait)``: average QoE ``v(Q) = Q``; max-min ``v(Q) = −max(Q_min − Q,
  0)`` (``Q_min`` = the lowest current QoE among live requests; the gain equals Equation 7
  whenever serving keeps the request at or above ``Q_min``); perfect-QoE count
  ``v(Q) = 1(Q = 1)·1(Q_now = 1)`` (Equation 8).
* **DP** (``solver=dp``) solves at most B items (the best over all b <= B) with KV
  quantised to ``dp_memory_units`` units (weights rounded up: always feasible); it is
  ``O(N·B·units)`` per candidate B, so slow, as the paper says.
* **Requests without a QoE spec** use ``default_ttft_s`` and ``default_tokens_per_s``.
* ``repeatable`` is False whenever Andes decides (its decisions depend on time); the vLLM
  fallback keeps its fast path only while nothing waits.

Layering note: :mod:`sloserve.optimal.knapsack` holds the solvers; it is a leaf module (numpy
only), which is why this policy may import it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from sloserve.core.errors import ConfigError
from sloserve.core.predictor import OutputLengthPredictor
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
from sloserve.engine.kv import KVCacheManager
from sloserve.optimal.knapsack import dp_pack, greedy_order, greedy_pack, quantize_weights
from sloserve.policies.infermax.unified import UnifiedConfig, UnifiedScheduler

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

RUNNING, SWAPPED, WAITING = 0, 1, 2
_EPS = 1e-9


# ---------------------------------------------------------------------------- QoE model
def _expected(t1: FloatArray, speed: FloatArray, total: FloatArray, t_end: float) -> FloatArray:
    """Tokens the ideal timeline expects by ``t_end`` (capped at the output length)."""
    e = np.where(t_end >= t1, np.floor((t_end - t1) * speed + _EPS) + 1.0, 0.0)
    return np.minimum(e, total)


def _new_tokens(
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
    k = np.where(span >= 0, np.floor(span / tau_a + _EPS) + 1.0, 0.0)
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
        c = np.where(slow, np.ceil((nxt - f) / np.where(slow, d, 1.0) - _EPS), 0.0)
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


def _qoe_end(
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
        k, s_new, l_new = _new_tokens(nxt, inv_s, np.maximum(total - n, 0.0), t_end, first, tau)
        expect = _expected(t1, 1.0 / inv_s, total, t_end)
        return _qoe_end(
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


# ---------------------------------------------------------------------------- objectives
@dataclass(frozen=True)
class ObjectiveContext:
    """What a gain function may need besides the predicted QoE."""

    q_now: FloatArray
    """Each candidate's current (in-flight) QoE."""
    q_min: float
    """The lowest current QoE among the live requests (1 when there are none)."""


class Objective(Protocol):
    """A scheduling objective (Andes appendix A) as a value function of predicted QoE:
    a request's knapsack gain is ``value(Q_serve) − value(Q_wait)``."""

    name: str
    needs_current: bool
    """Whether :meth:`value` reads ``ctx.q_now`` / ``ctx.q_min`` (they cost a pass)."""

    def value(self, q: FloatArray, ctx: ObjectiveContext) -> FloatArray: ...


class AverageQoE:
    """Maximise the average QoE (Equation 5): gain = Q_serve − Q_wait."""

    name = "avg"
    needs_current = False

    def value(self, q: FloatArray, ctx: ObjectiveContext) -> FloatArray:
        return q


class MaxMinQoE:
    """Maximise the minimum QoE (Equation 7): gain = max(Q_min − Q_wait, 0) when serving
    keeps the request at or above Q_min."""

    name = "max-min"
    needs_current = True

    def value(self, q: FloatArray, ctx: ObjectiveContext) -> FloatArray:
        return -np.maximum(ctx.q_min - q, 0.0)


class PerfectQoECount:
    """Maximise the number of requests with perfect QoE (Equation 8)."""

    name = "perfect"
    needs_current = True

    def value(self, q: FloatArray, ctx: ObjectiveContext) -> FloatArray:
        perfect_now = ctx.q_now >= 1.0 - _EPS
        return ((q >= 1.0 - _EPS) & perfect_now).astype(np.float64)


OBJECTIVES: dict[str, Callable[[], Objective]] = {
    "avg": AverageQoE,
    "max-min": MaxMinQoE,
    "perfect": PerfectQoECount,
}
_OBJECTIVE_ALIASES = {"average": "avg", "maxmin": "max-min", "min": "max-min"}


# ---------------------------------------------------------------------------- config
SolverName = Literal["greedy", "dp"]
ModeName = Literal["auto", "recompute", "swap"]


@dataclass(frozen=True)
class AndesConfig:
    """Parameters of the Andes policy (see the module docstring for the choices)."""

    delta_t: float = 1.0
    """Δt: the horizon (s) over which Q_serve and Q_wait are estimated."""
    watermark: float = 0.9
    """KV occupancy (and R_max fill, with ``slot_trigger``) that triggers the knapsack."""
    selective: bool = True
    """Selective triggering; False runs the knapsack at every iteration."""
    slot_trigger: bool = True
    """Also trigger when the running requests fill ``watermark`` of R_max."""
    solver: SolverName = "greedy"
    """``greedy`` (Algorithm 1) or ``dp`` (Algorithm 2, exact, slow)."""
    objective: str = "avg"
    """``avg`` (average QoE), ``max-min`` or ``perfect`` (appendix A)."""
    batch_min: int | None = None
    """Lower bound on the batch sizes searched (default: derived, see B_min)."""
    batch_max: int | None = None
    """Upper bound on the batch sizes searched (default: derived, see B_max)."""
    batch_candidates: int = 6
    """Batch sizes tried in [B_min, B_max] when that range is not a single point."""
    refiner: bool = True
    """The overhead-aware refiner (§4.3)."""
    refiner_victim_gains: bool = True
    """A pair's net QoE change also counts the gains its victims lose (False: only the
    loss the overhead inflicts on the running requests)."""
    preemption_mode: ModeName = "auto"
    """``auto`` (the cheaper of swap and recompute per request), ``recompute`` or ``swap``
    (falls back to recompute when the CPU tier is full)."""
    hybrid: bool = False
    """Decodes may share an iteration with (re)fills (False: as the vllm baseline)."""
    dp_memory_units: int = 256
    """KV quantisation for ``solver=dp`` (memory units of the DP table)."""
    default_ttft_s: float = 1.0
    """TTFT target for requests without a QoE spec."""
    default_tokens_per_s: float = 4.8
    """Reading speed for requests without a QoE spec (Andes' mean reading speed)."""

    def __post_init__(self) -> None:
        if not self.delta_t > 0:
            raise ValueError(f"delta_t must be > 0, got {self.delta_t}")
        if not 0 <= self.watermark <= 1:
            raise ValueError(f"watermark must be in [0, 1], got {self.watermark}")
        if self.solver not in ("greedy", "dp"):
            raise ValueError(f"solver must be greedy or dp, got {self.solver!r}")
        obj = _OBJECTIVE_ALIASES.get(self.objective, self.objective)
        if obj not in OBJECTIVES:
            raise ValueError(
                f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}"
            )
        object.__setattr__(self, "objective", obj)
        for name in ("batch_min", "batch_max"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if (
            self.batch_min is not None
            and self.batch_max is not None
            and self.batch_min > self.batch_max
        ):
            raise ValueError("batch_min must be <= batch_max")
        if self.batch_candidates < 1:
            raise ValueError("batch_candidates must be >= 1")
        if self.preemption_mode not in ("auto", "recompute", "swap"):
            raise ValueError(
                f"preemption_mode must be auto, recompute or swap, got {self.preemption_mode!r}"
            )
        if self.dp_memory_units < 1:
            raise ValueError("dp_memory_units must be >= 1")
        if not self.default_ttft_s >= 0 or not self.default_tokens_per_s > 0:
            raise ValueError("default_ttft_s must be >= 0 and default_tokens_per_s > 0")


def config_from_params(cls: type[Any], policy: str, params: Mapping[str, Any]) -> Any:
    """Build a frozen config dataclass from user params; ConfigError on anything wrong."""
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - valid)
    if unknown:
        raise ConfigError(
            f"policy {policy!r}: unknown parameter(s) {', '.join(unknown)}; "
            f"valid: {', '.join(sorted(valid))}"
        )
    try:
        return cls(**dict(params))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"policy {policy!r}: {e}") from e


# ---------------------------------------------------------------------------- estimates
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
            k, s_new, l_new = _new_tokens(
                self.nxt[idx], inv_s, self.avail[idx], self.t_end, first, tau
            )
            last = np.where(k > 0, l_new, self.a_last[idx])
            return _qoe_end(
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
        hurt = np.flatnonzero(v_max < v0 - _EPS)
        if hurt.size == 0:
            return out
        if overheads.size == 1:
            out[0] = float((v0 - v_max)[hurt].sum())
            return out
        ctx = ObjectiveContext(ctx.q_now[hurt], ctx.q_min)
        delayed = obj.value(self.q_serve(self.tau, overheads[:, None], hurt), ctx)
        return np.asarray((v0[hurt][None, :] - delayed).sum(axis=1), dtype=np.float64)


_Pair = tuple[int, list[int], int, int]
"""(admitted candidate, its victims, prefill tokens, KV blocks it needs)."""


class _Packer:
    """Builds admission/preemption pairs one at a time: each chosen waiting or swapped
    request (best first) with the lowest-priority victims that barely make room for it
    (KV blocks and an R_max slot). A (re)fill that does not fit this iteration's C / P
    budget is skipped without evicting anyone."""

    def __init__(
        self,
        kv: KVCacheManager,
        est: Estimate,
        admits: list[int],
        pool: list[int],
        *,
        avail: int,
        slots: int,
        budget_c: int,
        budget_p: int,
    ) -> None:
        self.kv = kv
        self.est = est
        self.admits = admits
        self.pos = 0
        self.pool = pool
        self.avail = avail
        self.slots = slots
        self.budget_c = budget_c
        self.budget_p = budget_p

    def next(self) -> _Pair | None:
        kv = self.kv
        reqs = self.est.reqs
        kind = self.est.kind
        pool = self.pool
        while self.pos < len(self.admits):
            a = self.admits[self.pos]
            self.pos += 1
            r = reqs[a]
            if kind[a] == WAITING:
                tok = r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens
                if tok > self.budget_c or tok > self.budget_p:
                    continue
                need = kv.blocks_needed(r.req_id, tok)
            else:
                if self.budget_c < 1:
                    continue
                tok = 0
                need = max(kv.swap_in_blocks_needed(r.req_id), int(self.est.blocks[a]))
            vict: list[int] = []
            f, s = self.avail, self.slots
            while (f < need or s < 1) and pool:
                v = pool.pop(0)
                vict.append(v)
                f += kv.num_request_blocks(reqs[v].req_id)
                s += 1
            if f < need or s < 1:
                pool[0:0] = vict
                continue
            self.avail, self.slots = f - need, s - 1
            self.budget_c -= tok if kind[a] == WAITING else 1
            self.budget_p -= tok
            return a, vict, tok, need
        return None

    def cancel(self, pairs: list[_Pair]) -> None:
        """Give the victims of cancelled pairs back (they keep running)."""
        back = [v for _a, vict, _t, _n in pairs for v in vict]
        self.pool[0:0] = back


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
        expect = _expected(t1, speed, total, t_end)
        q_wait = _qoe_end(n, sum_a, a_last, t1, inv_s, expect, t_end)
        obj = self.objective
        if obj.needs_current and reqs:
            q_now = _qoe_end(n, sum_a, a_last, t1, inv_s, _expected(t1, speed, total, now), now)
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
        packer = _Packer(
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
        self, view: InstanceView, est: Estimate, packer: _Packer, ongoing: list[int]
    ) -> list[_Pair]:
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
        accepted: list[_Pair] = []
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
                ok = np.where(has_victims, net - bound > _EPS, net - bound >= -_EPS) | ~checked
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
                if checked[k] and ((d <= _EPS) if has_victims[k] else (d < -_EPS)):
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


class AndesScheduler(QoEScheduler):
    """Andes (see the module docstring)."""

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
