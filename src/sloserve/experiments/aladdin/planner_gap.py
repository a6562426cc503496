"""Issue item 9: Aladdin's analytic worker count against the capacity planner's simulated
minimum, at each rate of the reproduction.

Aladdin's N_w (Eq. 7, ``⌈k5·r + c5⌉`` fitted to the reproduction's own fewest-worker
search for the ``aladdin`` arm, :mod:`sloserve.cluster.aladdin.gpu_count`) is set beside
what :func:`sloserve.plan_capacity` finds as the fewest replicas of Table 3's worker that
meet Table 2's SLOs with the ``aladdin`` router and with ``least-loaded`` (JSQ by
outstanding work), on the same workload (Poisson arrivals at the rate, the ``sharegpt``
mix, the plan's duration and seed). The planner's targets are ``ttft`` and ``tpot``
(its tpot is ``(last token − first token)/(output − 1)``, the paper's ATGT) at the plan's
attainment, over the plan's seed only (the reproduction's own search uses one seed too),
with Aladdin's γ and θ. The gap is ``N_w·tp − planner GPUs`` (positive: Eq. 7 asks for
more GPUs than the simulation needs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd

from sloserve.experiments.aladdin.plan import Plan, Scenario

PLANNER_ROUTERS = ("aladdin", "least-loaded")


def planner_minimum(plan: Plan, sc: Scenario) -> pd.DataFrame:
    """router, rate, gpus: the planner's fewest GPUs (NaN where none up to the plan's
    largest cluster meets the SLOs)."""
    from sloserve.experiments.capacity.run import plan_capacity

    workload = {
        "arrival": {"kind": "poisson", "rate": plan.rates[0]},
        "duration_s": plan.duration_s,
        "mix": "sharegpt",
        "seed": plan.seed,
    }
    res = plan_capacity(
        workload,
        slo=f"ttft={sc.ttft_ms:g}ms,tpot={sc.atgt_ms:g}ms",
        attainment=plan.target,
        profiles=[sc.profile(sc.tp)],
        routers=list(PLANNER_ROUTERS),
        rates=list(plan.rates),
        seeds=[plan.seed],
        max_replicas=plan.max_workers,
        router_params={"aladdin": {"gamma": plan.gamma, "theta": plan.theta}},
        workers=1,
    )
    a = res.answers
    return pd.DataFrame({"router": a["router"], "rate": a["rate"].astype(float), "gpus": a["gpus"]})


def planner_gap(
    plan: Plan,
    sc: Scenario,
    predicted_gpus: Mapping[float, int],
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """scenario, rate, analytic_gpus (Eq. 7 × tp), planner_gpus_<router> and
    gap_<router> (analytic − planner) per rate of ``predicted_gpus``."""
    mins = planner_minimum(plan, sc)
    rows = []
    for rate, pred in sorted(predicted_gpus.items()):
        row: dict[str, object] = {"scenario": sc.name, "rate": rate, "analytic_gpus": pred}
        for r in PLANNER_ROUTERS:
            hit = mins[(mins["router"] == r) & (mins["rate"] == rate)]["gpus"]
            g = float(hit.iloc[0]) if len(hit) and pd.notna(hit.iloc[0]) else float("nan")
            row[f"planner_gpus_{r}"] = g
            row[f"gap_{r}"] = pred - g
        rows.append(row)
        if progress is not None:
            progress(f"planner gap {sc.name} {rate:g}/s: {row}")
    return pd.DataFrame(rows)
