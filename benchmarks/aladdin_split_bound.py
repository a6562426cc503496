"""Aladdin §5.1 / Fig. 12: why split-phase placement saves no decode GPUs in our simulation.

Decode workers of a split cluster do nothing but decode, so the fewest that can carry a
rate is bounded by throughput whatever the router does. With the §3 decode model fitted to
the worker's cost model, ``t_d(b) = k2·b·l̄ + c2·b + c3`` (``l̄`` the token-weighted mean
context a decode step reads: ``Σ l_out·(l_in + l_out/2) / Σ l_out`` over the workload's
history), the largest batch that still decodes within the ATGT SLO is
``b* = max{b : t_d(b) ≤ T_dec}``, and the KV cache holds about ``b_kv = M / l̄`` requests
(``M`` the worker's KV tokens at the default 0.9 memory utilisation; ``l̄`` is also the
mean KV a request in the system holds, long requests counted for longer). A worker at
``b = min(b*, b_kv)`` generates ``b/t_d(b)`` tokens per second, and ``r`` requests per
second need about

    W_fluid = r · E[l_out] · t_d(b) / b

decode workers. It is a fluid estimate, not a strict bound (an SLO is on each request's
average gap, and the target admits 1 % of misses), but no placement can pack decode work
much tighter than every worker running at ``b*``.

For each rate the script prints ``W_fluid`` and the fewest decode workers each split arm
(Aladdin, JSQ, power of two; ``experiments/aladdin/plan.py``) needs for the reproduction's
target (99 % of requests within both SLOs), simulated with the reproduction's own code
(prefill workers ``⌈2·r·t_pre(mean prompt)⌉``, KV hand-offs over PCIe), and its
attainment there (65 with attainment 0: no count up to 64 meets the target). Aladdin's
Fig. 12 saving (−60 % against JSQ) would need JSQ at 2.5 times the fewest Aladdin needs;
when JSQ's count is ``⌈W_fluid⌉`` already, no router can be 60 % below it.

    PYTHONPATH=src python benchmarks/aladdin_split_bound.py [--rates 10,20,40] [--duration 30]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import numpy as np

from sloserve.cluster.aladdin import fit_profile
from sloserve.cluster.aladdin.lengths import history
from sloserve.costmodel.profile import load_profile
from sloserve.experiments.aladdin.plan import SC_70B, SPLIT_ARMS, Plan
from sloserve.experiments.aladdin.reproduce import fewest, prefill_workers


def fluid_workers(
    profile: str, atgt_s: float, rate: float, mix: str = "sharegpt"
) -> dict[str, float]:
    """``b*``, ``b_kv``, the mean output and context, and ``W_fluid`` (module docstring)."""
    prompts, outs = history(mix)
    p, o = np.asarray(prompts, dtype=float), np.asarray(outs, dtype=float)
    ctx = float(np.sum(o * (p + o / 2)) / np.sum(o))
    m = fit_profile(profile)
    b_star = 0
    while m.decode_s(b_star + 1, (b_star + 1) * ctx) <= atgt_s:
        b_star += 1
    kv_tokens = load_profile(profile).kv_capacity_tokens()
    b = min(b_star, int(kv_tokens // ctx))
    return {
        "b_star": float(b_star),
        "kv_tokens": float(kv_tokens),
        "b_kv": kv_tokens / ctx,
        "mean_out": float(o.mean()),
        "step_context": ctx,
        "w_fluid": rate * float(o.mean()) * m.decode_s(b, b * ctx) / b,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="10,20,40")
    ap.add_argument("--duration", type=float, default=30.0, help="simulated seconds per run")
    a = ap.parse_args()
    sc = SC_70B
    plan = dataclasses.replace(Plan.quick(), duration_s=a.duration, max_workers=64)
    for rate in (float(r) for r in a.rates.split(",")):
        row: dict[str, object] = {"scenario": sc.name, "rate": rate}
        row["prefill_workers"] = prefill_workers(sc, rate)
        row |= fluid_workers(sc.profile(sc.tp), sc.atgt_ms / 1e3, rate)
        row["w_fluid_ceil"] = math.ceil(float(str(row["w_fluid"])))
        for arm in SPLIT_ARMS:
            w, st = fewest(plan, sc, arm, rate)
            row[arm.name] = w
            row[f"{arm.name}_attainment"] = round(st.attainment, 4)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
