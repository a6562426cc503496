"""The column (numpy) implementation of Algorithm 1 decides exactly as the scalar one.

``ScalarPlacement`` is the implementation before the columns were introduced (one request
at a time, no cached capacity_norm), kept here as the reference: a seeded run of
placements, finishes, re-predictions and both slack rules must give the same worker for
every request, the same refusal counts and the same ledgers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sloserve.cluster.aladdin.lengths import LengthPredictor, OracleLengths
from sloserve.cluster.aladdin.perf_models import PerfModels
from sloserve.cluster.aladdin.placement import Placed, Placement, Slo, Worker


class ScalarPlacement(Placement):
    """The scalar reference (the code the column version replaced)."""

    def capacity_norm(self, w: Worker) -> float:
        return math.hypot(w.batch / self.batch_cap, self.weighted_context(w) / self.context_cap)

    def _progress(self, w: Worker, now: float) -> tuple[np.ndarray, float]:
        reqs = list(w.requests.values())
        t_d = self._step_s(w)
        gen = np.empty(len(reqs))
        for i, p in enumerate(reqs):
            g = self.generated(w, p, now, t_d)
            if g >= p.l_pred:
                w.requests.set_pred(p, self.predictor.repredict(p.l_in, g, p.true_out))
            gen[i] = min(g, p.l_pred - 1)
        return gen, t_d

    def _slack(self, w: Worker, gen: np.ndarray, t_d: float, now: float) -> float:
        t_dec = self.slo.atgt_s
        reqs = w.requests.values()
        if self.slack == "budget":
            per_tok = max(t_dec - t_d, 0.0)
            return min(per_tok * p.l_pred - p.stall_s for p in reqs)
        saved = [
            t_dec * g - max(0.0, now - p.placed_at - self._own_prefill(p))
            for p, g in zip(reqs, gen, strict=True)
        ]
        return min(saved, default=math.inf)

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
        if w.requests and not self.decode_only and t_new > th * self._slack(w, gen, t_d, now):
            out.append("d")
            if first:
                return out
        reqs = list(w.requests.values())
        l_in_a = np.array([p.l_in for p in reqs] + [l_in], dtype=np.float64)
        done = np.array([p.l_pred for p in reqs] + [l_pred], dtype=np.float64)
        gen_a = np.append(gen, 0.0)
        remaining = done - gen_a
        order = np.argsort(remaining, kind="stable")
        rem, base = remaining[order], (l_in_a + gen_a)[order]
        suffix_base = np.cumsum(base[::-1])[::-1]
        alive = np.arange(len(rem), 0, -1, dtype=np.float64)
        peak = m.h * (suffix_base + alive * rem) + m.j * alive
        if float(peak.max()) > (1.0 - self.kv_margin) * w.kv_capacity_gib:
            out.append("e")
        return out

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
        if not self.decode_only:
            t_new = self.m.prefill_s(queued + l_in)
            for p in w.requests.values():
                p.stall_s += t_new
        w.requests[req_id] = Placed(req_id, l_in, l_pred, now, true_out)
        self.where[req_id] = w.worker_id
        return w.worker_id


# Llama-2-70B-like models in seconds and GiB (a 75 ms ATGT leaves room for ~60 requests).
MODELS = PerfModels(h=3.05e-4, j=0.0, k1=3.2e-4, c1=0.012, k2=1.2e-7, c2=2.5e-4, c3=0.054)
SLO = Slo(ttft_s=1.6, atgt_s=0.075)


def _ledger(pl: Placement) -> list[tuple[int, list[tuple[object, int, float, float]]]]:
    return [
        (wid, [(p.req_id, p.l_pred, p.stall_s, p.placed_at) for p in w.requests.values()])
        for wid, w in sorted(pl.workers.items())
    ]


@pytest.mark.parametrize(
    ("slack", "decode_only", "oracle"),
    [
        ("saved", False, False),
        ("budget", False, False),
        ("saved", True, False),
        ("saved", False, True),
    ],
)
def test_columns_decide_as_the_scalar_reference(
    slack: str, decode_only: bool, oracle: bool
) -> None:
    rng = np.random.default_rng(7)
    prompts = rng.lognormal(5.5, 1.0, 4000).astype(int) + 1
    outputs = rng.lognormal(5.0, 1.1, 4000).astype(int) + 1
    kw = {"slack": slack, "decode_only": decode_only, "gamma": 0.5, "theta": 0.9}
    pls = [
        cls(MODELS, SLO, (OracleLengths if oracle else LengthPredictor)(prompts, outputs), **kw)
        for cls in (ScalarPlacement, Placement)
    ]
    for pl in pls:
        for w in range(12):
            pl.add_worker(w, 30.0 + 2.0 * (w % 3))
    now, live, placed_any = 0.0, [], 0
    for k in range(1500):
        now += float(rng.exponential(0.08))
        l_in, out = int(rng.choice(prompts)), int(rng.choice(outputs))
        cands = [(int(w), int(rng.integers(0, 600))) for w in rng.permutation(12)[:9]]
        overflow = bool(rng.random() < 0.3)
        prefer = int(rng.integers(0, 12)) if rng.random() < 0.1 else None
        got = [pl.place(k, l_in, now, cands, out, prefer, overflow) for pl in pls]
        assert got[0] == got[1], f"request {k}: {got}"
        if got[0] is not None:
            live.append(k)
            placed_any += 1
        # Finishes: the oldest request sometimes, a random one sometimes.
        while live and rng.random() < 0.45:
            rid = live.pop(0 if rng.random() < 0.6 else int(rng.integers(0, len(live))))
            assert pls[0].remove(rid) == pls[1].remove(rid)
        if k % 50 == 0:
            for pl in pls:
                for w in pl.workers.values():
                    pl.refresh(w, now)
            assert _ledger(pls[0]) == _ledger(pls[1])
    assert pls[0].refusals == pls[1].refusals
    assert pls[0].overflows == pls[1].overflows
    assert _ledger(pls[0]) == _ledger(pls[1])
    # The run exercised the constraints (not a run where everything fits everywhere).
    assert placed_any > 300 and sum(pls[1].refusals.values()) > 300
