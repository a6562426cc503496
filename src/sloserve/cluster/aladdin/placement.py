"""Aladdin §4.2, Algorithm 1: online best-fit placement of requests onto workers.

Each worker keeps a ledger of the requests placed on it: prompt length ``l_in``, predicted
output ``l_pred``, when it was placed and how much prefill stall it has absorbed. A new
request goes to the most loaded worker (by ``capacity_norm``, descending) on which all
four constraints hold; if none, Algorithm 1 opens a new worker (the caller's business).

Constraints, for a worker with ongoing requests ``J`` and the new request ``n``:

- (b) decode context: ``Σ_{J∪n} (l_in + γ·l_pred) ≤ θ·l_d(|J| + 1)`` (Eq. 4);
- (c) prefill within the TTFT SLO: ``t_pre(queued prompt tokens + l_in^n) ≤ T_pre``;
- (d) the new prefill fits in the ongoing requests' ATGT slack:
  ``t_pre(queued + l_in^n) ≤ θ·min_j slack_j``;
- (e) the KV footprint vector of ``J ∪ n`` (each request's ``kv(l_in + k)`` for its
  iterations ``k`` to come, 0 once it is done) never exceeds ``M``.

With ``decode_only`` (split prefill/decode, §5.1: decode workers of a disaggregated
cluster receive requests whose prompt a prefill worker computed) only (b) and (e) apply:
no prefill runs there, so none delays a first token (c) or stalls the decodes (d), and a
placed request decodes from the moment it is placed.

Choices where the paper is vague (parameters of :class:`Placement`):

- ``capacity_norm`` is the L2 norm of the batch size over ``B_cap`` (the largest batch
  Eq. 4 allows with no context, ``(T_dec − c3)/c2``, capped at ``max_batch``) and of
  ``Σ(l_in + γ·l_pred)`` over ``l_d(1)``: both in [0, 1] on a worker that meets (b).
- A request's ATGT slack (``slack``): ``"saved"`` (the default, the paper's (d): "the time
  that ongoing requests have saved compared with the ATGT limit", ``T_dec·l_out − t_dec``)
  is ``T_dec·g − e`` for a request that has generated ``g`` tokens in the ``e ≥ 0``
  seconds since its prefill. A request that has not decoded yet has saved nothing, so a
  worker takes no new prompt while one of its requests waits for, or has just left, its
  prefill: the paper places the arrivals of a heartbeat together (their prefills share a
  batch), we place each at its arrival, so prompts arriving close together spread over
  workers instead of stalling one another. (Leaving such requests out of the minimum lets
  a fresh worker take a burst of prompts whose prefills then stall the first ones far past
  their ATGT: their estimated start keeps moving with each prefill charged to them.)
  ``"budget"`` (the earlier choice, kept for comparison)
  is what the SLO allows beyond the predicted decode time over the predicted life,
  ``(T_dec − t_d)·l_pred``, less the prefill stalls already charged: it lets a burst of
  prefills spend a young request's whole-life budget at once, after which its worker
  refuses everything until that request ends. Either way a placed prefill charges its
  ``t_pre`` to every request on that worker (the stall its progress estimate accounts).
- Progress is estimated, not observed (a router sees no per-request counters): a request
  starts decoding ``t_pre(l_in)`` after placement and generates one token per decode
  iteration ``t_d`` of its worker. When it outlives its prediction, it is re-predicted
  (:meth:`~sloserve.cluster.aladdin.lengths.LengthPredictor.repredict`).
- Constraint (e) keeps ``kv_margin`` (5 %) of ``M`` free: the footprint is the fitted
  ``kv`` model over estimated progress, while the engine allocates whole blocks per request
  and preempts (recomputing a prompt, a long stall for the whole batch) as soon as one more
  block does not fit. Measured on Llama-2-70B decode workers (split phases, 20 req/s):
  with the true output lengths and no margin they still preempted 22 times (10 % ATGT
  misses); with 5 % none did.
- Constraint (e) is checked at each iteration where a request ends (the footprint is
  piecewise linear in between, so its peaks are there), in O(n log n) per worker. A
  request of ``l_pred`` output tokens holds ``kv(l_in + k)`` for ``k = 0..l_pred`` (the
  paper's footprint vector ``w``).

Speed: every decision may check every worker, so each worker keeps its ledger as numpy
columns (:class:`Columns`, rebuilt only after the ledger changed: the ledger counts its
changes in ``version``) and its capacity_norm (recomputed on the same condition); the
progress estimate, the slack and the footprint are array expressions over those columns,
the same floating-point operations in the same order as one request at a time, so the
decisions are identical (``tests/test_aladdin_placement_speed.py`` replays a seeded run
against the scalar reference).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sloserve.cluster.aladdin.lengths import LengthPredictor
from sloserve.cluster.aladdin.perf_models import PerfModels
from sloserve.core.errors import ConfigError

CONSTRAINTS = ("b", "c", "d", "e")
SLACKS = ("saved", "budget")


@dataclass
class Placed:
    """One request in a worker's ledger."""

    req_id: int | str
    l_in: int
    l_pred: int
    placed_at: float
    true_out: int | None = None
    stall_s: float = 0.0
    l_first: int = 0
    """The prediction at placement (``l_pred`` grows when re-predicted; 0: ``l_pred``)."""

    def __post_init__(self) -> None:
        if not self.l_first:
            self.l_first = self.l_pred


class Ledger(dict[int | str, Placed]):
    """A worker's requests by id, with running sums of ``l_in`` and ``l_pred``:
    capacity_norm and constraint (b) read them for every worker at every decision, so they
    cost O(1) instead of a pass over the worker's requests. Change a placed request's
    prediction through :meth:`set_pred` so that the sums follow."""

    def __init__(self) -> None:
        super().__init__()
        self.sum_in = 0
        self.sum_pred = 0
        self.version = 0
        """Bumped by every change made through the ledger (cached columns follow it)."""

    def __setitem__(self, key: int | str, p: Placed) -> None:
        self.pop(key)
        super().__setitem__(key, p)
        self.sum_in += p.l_in
        self.sum_pred += p.l_pred
        self.version += 1

    def pop(self, key: int | str, default: Placed | None = None) -> Placed | None:  # type: ignore[override]
        p = super().pop(key, None)
        if p is None:
            return default
        self.sum_in -= p.l_in
        self.sum_pred -= p.l_pred
        self.version += 1
        return p

    def __delitem__(self, key: int | str) -> None:
        if self.pop(key) is None:
            raise KeyError(key)

    def clear(self) -> None:
        super().clear()
        self.sum_in = self.sum_pred = 0
        self.version += 1

    def set_pred(self, p: Placed, l_pred: int) -> None:
        """Re-predict ``p`` (one of this ledger's requests) to ``l_pred`` output tokens."""
        self.sum_pred += l_pred - p.l_pred
        p.l_pred = l_pred
        self.version += 1

    def restart(self, p: Placed, now: float) -> None:
        """``p`` has not started: its estimated start moves to ``now`` (no stall yet)."""
        p.placed_at, p.stall_s = max(p.placed_at, now), 0.0
        self.version += 1

    def add_stall(self, seconds: float) -> None:
        """A new prefill on this worker stalls every request's decode by ``seconds``."""
        for p in self.values():
            p.stall_s += seconds
        self.version += 1


@dataclass
class Columns:
    """A ledger as numpy columns, in the ledger's order (module docstring, "Speed");
    ``own`` is the request's own prefill, ``started`` when it starts decoding
    (``placed_at + own + stall``, summed in that order as :meth:`Placement.generated`
    does)."""

    reqs: list[Placed]
    l_in: np.ndarray
    l_pred: np.ndarray
    placed_at: np.ndarray
    own: np.ndarray
    started: np.ndarray
    stall: np.ndarray
    version: int


@dataclass
class Worker:
    """The ledger of one worker (a replica)."""

    worker_id: int
    kv_capacity_gib: float
    requests: Ledger = field(default_factory=Ledger)
    cols: Columns | None = None
    """The ledger's columns as of ``cols.version`` (stale when the ledger moved on)."""
    norm: tuple[int, float] = (-1, 0.0)
    """(ledger version, capacity_norm) last computed."""

    @property
    def batch(self) -> int:
        return len(self.requests)


@dataclass(frozen=True)
class Slo:
    """The two SLOs Aladdin packs against (seconds)."""

    ttft_s: float
    atgt_s: float


class Placement:
    """Algorithm 1 over a set of workers (module docstring).

    ``gamma`` in [0, 1] weighs predicted outputs in (b) and capacity_norm; ``theta`` in
    (0, 1] tightens (b) and (d) against prediction error.
    """

    def __init__(
        self,
        models: PerfModels,
        slo: Slo,
        predictor: LengthPredictor,
        *,
        gamma: float = 0.5,
        theta: float = 0.9,
        max_batch: int = 256,
        slack: str = "saved",
        decode_only: bool = False,
        kv_margin: float = 0.05,
    ) -> None:
        if not 0 <= gamma <= 1:
            raise ConfigError(f"gamma: {gamma} is outside [0, 1]")
        if not 0 < theta <= 1:
            raise ConfigError(f"theta: {theta} is outside (0, 1]")
        if slack not in SLACKS:
            raise ConfigError(f"slack: {slack!r} is not one of {', '.join(SLACKS)}")
        self.slack = slack
        self.decode_only = decode_only
        if not 0 <= kv_margin < 1:
            raise ConfigError(f"kv_margin: {kv_margin} is outside [0, 1)")
        self.kv_margin = kv_margin
        if not slo.ttft_s > 0:
            raise ConfigError(f"slo_ttft_ms: {slo.ttft_s * 1e3:g} must be positive")
        models.check_atgt(slo.atgt_s)
        if models.prefill_s(1) > slo.ttft_s:
            raise ConfigError(
                f"slo_ttft_ms: {slo.ttft_s * 1e3:g} ms is below a one-token prefill "
                f"({models.prefill_s(1) * 1e3:.3g} ms)"
            )
        self.m, self.slo, self.predictor = models, slo, predictor
        self.gamma, self.theta = gamma, theta
        cap = (slo.atgt_s - models.c3) / models.c2 if models.c2 > 0 else math.inf
        self.batch_cap = float(max(1.0, min(cap, max_batch)))
        self.max_batch = max_batch
        self.context_cap = max(models.context_limit(1, slo.atgt_s), 1.0)
        self.workers: dict[int, Worker] = {}
        self.where: dict[int | str, int] = {}
        self.refusals = dict.fromkeys(CONSTRAINTS, 0)
        self.overflows = 0
        """Requests placed on the least loaded worker although none met the constraints."""

    # ------------------------------------------------------------------ ledger
    def add_worker(self, worker_id: int, kv_capacity_gib: float) -> Worker:
        w = self.workers.get(worker_id)
        if w is None:
            w = self.workers[worker_id] = Worker(worker_id, kv_capacity_gib)
        return w

    def remove(self, req_id: int | str) -> tuple[int, Placed] | None:
        """A request ended (or is routed again): it leaves its worker's ledger; returns the
        worker id and the ledger entry (None if it was on no ledger)."""
        wid = self.where.pop(req_id, None)
        w = self.workers.get(wid) if wid is not None else None
        if w is None:  # a drained worker's ledger is gone already
            return None
        p = w.requests.pop(req_id, None)
        return None if p is None else (w.worker_id, p)

    def weighted_context(self, w: Worker) -> float:
        return w.requests.sum_in + self.gamma * w.requests.sum_pred

    def capacity_norm(self, w: Worker) -> float:
        """L2 norm of the normalised batch size and weighted context (module docstring)."""
        v = w.requests.version
        if w.norm[0] != v:
            n = math.hypot(w.batch / self.batch_cap, self.weighted_context(w) / self.context_cap)
            w.norm = (v, n)
        return w.norm[1]

    def columns(self, w: Worker) -> Columns:
        """The ledger of ``w`` as numpy columns, rebuilt when it changed."""
        c, v = w.cols, w.requests.version
        if c is None or c.version != v:
            reqs = list(w.requests.values())
            placed = np.array([p.placed_at for p in reqs], dtype=np.float64)
            own = np.array([self._own_prefill(p) for p in reqs], dtype=np.float64)
            stall = np.array([p.stall_s for p in reqs], dtype=np.float64)
            c = w.cols = Columns(
                reqs,
                np.array([p.l_in for p in reqs], dtype=np.float64),
                np.array([p.l_pred for p in reqs], dtype=np.float64),
                placed,
                own,
                (placed + own) + stall,
                stall,
                v,
            )
        return c

    def _step_s(self, w: Worker) -> float:
        """The worker's estimated decode iteration now (the ledger's mean context)."""
        ctx = w.requests.sum_in + w.requests.sum_pred / 2
        return max(self.m.decode_s(max(w.batch, 1), ctx), 1e-6)

    def generated(self, w: Worker, p: Placed, now: float, t_d: float | None = None) -> int:
        """Estimated output tokens ``p`` has generated on ``w`` by ``now`` (module docstring)."""
        started = p.placed_at + self._own_prefill(p) + p.stall_s
        return int(max(0.0, now - started) / (t_d or self._step_s(w)))

    def _own_prefill(self, p: Placed) -> float:
        """How long after placement ``p`` starts decoding (0 on a decode-only worker)."""
        return 0.0 if self.decode_only else self.m.prefill_s(p.l_in)

    def refresh(self, w: Worker, now: float) -> None:
        """Re-predict the requests of ``w`` that outlived their prediction."""
        self._progress(w, now)

    def _progress(self, w: Worker, now: float) -> tuple[np.ndarray, float]:
        """Estimated tokens generated by each request of ``w`` (re-predicting those that
        outlived their prediction, in ledger order) and the worker's decode iteration now:
        :meth:`generated` over the columns."""
        c = self.columns(w)
        t_d = self._step_s(w)
        g = now - c.started
        np.maximum(g, 0.0, out=g)
        g /= t_d
        np.floor(g, out=g)
        over = g >= c.l_pred
        if over.any():
            for i in np.flatnonzero(over).tolist():
                p = c.reqs[i]
                w.requests.set_pred(p, self.predictor.repredict(p.l_in, int(g[i]), p.true_out))
                c.l_pred[i] = p.l_pred
            c.version = w.requests.version  # the columns followed the re-predictions
        return np.minimum(g, c.l_pred - 1), t_d

    def _slack(self, w: Worker, gen: np.ndarray, t_d: float, now: float) -> float:
        """The smallest ATGT slack of the worker's requests (module docstring, ``slack``)."""
        t_dec = self.slo.atgt_s
        c = self.columns(w)
        if not c.reqs:
            return math.inf
        if self.slack == "budget":
            per_tok = max(t_dec - t_d, 0.0)
            return float((per_tok * c.l_pred - c.stall).min())
        waited = (now - c.placed_at) - c.own
        np.maximum(waited, 0.0, out=waited)
        return float((t_dec * gen - waited).min())

    # ------------------------------------------------------------------ constraints
    def violated(
        self, w: Worker, l_in: int, l_pred: int, now: float, queued_tokens: int = 0
    ) -> str | None:
        """The first constraint (b, c, d, e) placing the request on ``w`` breaks, or None."""
        v = self.violations(w, l_in, l_pred, now, queued_tokens, first=True)
        return v[0] if v else None

    def violations(
        self,
        w: Worker,
        l_in: int,
        l_pred: int,
        now: float,
        queued_tokens: int = 0,
        *,
        first: bool = False,
    ) -> list[str]:
        """Every constraint placing the request on ``w`` breaks (only the first when
        ``first``), in the order b, c, d, e."""
        m, slo, th = self.m, self.slo, self.theta
        out: list[str] = []
        b = w.batch + 1
        ctx = self.weighted_context(w) + l_in + self.gamma * l_pred
        if b > self.max_batch or ctx > th * m.context_limit(b, slo.atgt_s):
            out.append("b")
            if first:
                return out
        t_new = 0.0 if self.decode_only else m.prefill_s(queued_tokens + l_in)
        if t_new > slo.ttft_s:
            out.append("c")
            if first:
                return out
        gen, t_d = self._progress(w, now)
        if w.requests and not self.decode_only:
            slack = self._slack(w, gen, t_d, now)
            if t_new > th * slack:
                out.append("d")
                if first:
                    return out
        c = self.columns(w)
        l_in_a = np.append(c.l_in, float(l_in))
        done = np.append(c.l_pred, float(l_pred))
        gen_a = np.append(gen, 0.0)
        remaining = done - gen_a  # output tokens each request still generates
        # Request i holds kv(base_i + k) at iterations k = 0..rem_i (Eq. 1, the w vector),
        # so Σ peaks just before one ends: at k = rem_i, over the requests still there.
        order = np.argsort(remaining, kind="stable")
        rem, base = remaining[order], (l_in_a + gen_a)[order]
        suffix_base = np.cumsum(base[::-1])[::-1]
        alive = np.arange(len(rem), 0, -1, dtype=np.float64)
        peak = m.h * (suffix_base + alive * rem) + m.j * alive
        if float(peak.max()) > (1.0 - self.kv_margin) * w.kv_capacity_gib:
            out.append("e")
        return out

    def place(
        self,
        req_id: int | str,
        l_in: int,
        now: float,
        candidates: list[tuple[int, int]],
        true_out: int | None = None,
        prefer: int | None = None,
        overflow: bool = False,
    ) -> int | None:
        """Algorithm 1: the worker id (from ``candidates``, pairs of worker id and its
        queued prompt tokens) the request goes to, most loaded feasible first; None when
        no candidate fits (open a worker, or hold), unless ``overflow``: then the least
        loaded candidate takes it anyway. ``prefer`` (a re-balancing move's destination,
        Algorithm 2) is tried before the others."""
        l_pred = self.predictor.predict(l_in, true_out)
        norm, workers = self.capacity_norm, self.workers
        keyed = [
            (w.worker_id != prefer, -norm(w), w.worker_id, w)
            for w in (workers[c] for c, _ in candidates)
        ]
        keyed.sort(key=lambda k: k[:3])
        ws = [k[3] for k in keyed]
        queued = dict(candidates)
        for w in ws:
            why = self.violated(w, l_in, l_pred, now, queued[w.worker_id])
            if why is None:
                return self._put(w, req_id, l_in, l_pred, now, true_out, queued[w.worker_id])
            self.refusals[why] += 1
        if overflow and ws:
            self.overflows += 1
            w = min(ws, key=lambda w: (self.capacity_norm(w), w.worker_id))
            return self._put(w, req_id, l_in, l_pred, now, true_out, queued[w.worker_id])
        return None

    def _put(
        self,
        w: Worker,
        req_id: int | str,
        l_in: int,
        l_pred: int,
        now: float,
        true_out: int | None,
        queued: int,
    ) -> int:
        if not self.decode_only:  # the new prefill stalls the worker's decodes
            w.requests.add_stall(self.m.prefill_s(queued + l_in))
        w.requests[req_id] = Placed(req_id, l_in, l_pred, now, true_out)
        self.where[req_id] = w.worker_id
        return w.worker_id
