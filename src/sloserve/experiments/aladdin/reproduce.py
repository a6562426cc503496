"""Run the plan: the fewest GPUs meeting the SLOs per arm and rate, Aladdin's analytic N_w
beside the simulated minimum, and the headline reductions beside the paper's."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sloserve.cluster.aladdin.gpu_count import fit_worker_law
from sloserve.experiments.aladdin.plan import Arm, Plan, Scenario

PAPER = {
    "vs vllm-default": -0.71,
    "vs jsq-optimal": -0.40,
    "split vs jsq-split": -0.60,
    "split vs power-of-two-split": -0.49,
}
"""Aladdin §6.4 (Fig. 11; Fig. 12 for the decode GPUs of split phases): GPU reductions."""


@dataclass
class Reproduction:
    gpus: pd.DataFrame
    """scenario, arm, rate, workers, gpus, attainment (of the fewest that met the SLOs)."""
    headline: dict[str, Any]


def attainment(table: pd.DataFrame, sc: Scenario) -> float:
    """Share of requests with TTFT ≤ the prefill SLO and ATGT ≤ the decode SLO."""
    if not len(table):
        return 0.0
    atgt = table["atgt_s"].fillna(0.0)
    ok = (
        (table["status"] == "finished")
        & (table["ttft_s"] <= sc.ttft_ms / 1e3)
        & (atgt <= sc.atgt_ms / 1e3)
    )
    return float(ok.mean())


def run_once(plan: Plan, sc: Scenario, arm: Arm, rate: float, workers: int) -> float:
    """SLO attainment of ``arm`` with ``workers`` workers at ``rate``."""
    from sloserve.cluster.config import ClusterConfig
    from sloserve.config import validate
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.runner import SimConfig

    tp = sc.machine_gpus if arm.default_worker else sc.tp
    params: dict[str, Any] = dict(arm.params)
    if arm.router == "aladdin":
        params |= {
            "slo_ttft_ms": sc.ttft_ms,
            "slo_atgt_ms": sc.atgt_ms,
            "gamma": plan.gamma,
            "theta": plan.theta,
        }
    cfg = {
        "workload": {
            "arrival": {"kind": "poisson", "rate": rate},
            "duration_s": plan.duration_s,
            "mix": "sharegpt",
            "seed": plan.seed,
        },
        "instance": {"profile": sc.profile(tp)},
    }
    replicas: list[dict[str, Any]] = [{"count": workers}]
    if arm.split:
        replicas = [
            {"role": "prefill", "count": prefill_workers(sc, rate)},
            {"role": "decode", "count": workers},
        ]
    cluster = {"replicas": replicas, "router": arm.router, "router_params": params}
    sim = validate(SimConfig, cfg, "aladdin plan")
    res = simulate_cluster(sim, ClusterConfig.load(cluster, "aladdin plan: cluster"))
    return attainment(res.table, sc)


def prefill_workers(sc: Scenario, rate: float) -> int:
    """Split phases: prefill workers at most half busy, ``⌈2·r·t_pre(mean prompt)⌉``."""
    import math

    from sloserve.cluster.aladdin import fit_profile
    from sloserve.cluster.aladdin.lengths import history

    prompts, _ = history("sharegpt")
    t_pre = fit_profile(sc.profile(sc.tp)).prefill_s(float(prompts.mean()))
    return max(1, math.ceil(2 * rate * t_pre))


def fewest(plan: Plan, sc: Scenario, arm: Arm, rate: float) -> tuple[int, float]:
    """The fewest workers whose attainment reaches the target (binary search; attainment
    grows with workers), and that attainment; ``max_workers + 1`` when none does."""
    lo, hi, best = 1, plan.max_workers, (plan.max_workers + 1, 0.0)
    while lo <= hi:
        mid = (lo + hi) // 2
        a = run_once(plan, sc, arm, rate, mid)
        if a >= plan.target:
            best, hi = (mid, a), mid - 1
        else:
            lo = mid + 1
    return best


def reproduce(
    plan: Plan, out: str | Path, progress: Callable[[str], None] | None = None
) -> Reproduction:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for sc in plan.scenarios:
        for arm in plan.arms:
            per = sc.machine_gpus if arm.default_worker else sc.tp
            for rate in plan.rates_for(arm):
                w, a = fewest(plan, sc, arm, rate)
                rows.append(
                    {
                        "scenario": sc.name,
                        "arm": arm.name,
                        "rate": rate,
                        "workers": w,
                        "gpus": w * per,
                        "attainment": a,
                    }
                )
                if progress is not None:
                    progress(f"{sc.name} {arm.name} {rate:g}/s: {w * per} GPUs")
    df = pd.DataFrame(rows)
    head: dict[str, Any] = {"paper": PAPER, "ours": {}, "worker_law": {}}
    for sc in plan.scenarios:
        d = df[df["scenario"] == sc.name]
        al = d[d["arm"] == "aladdin"].sort_values("rate")
        if len(al) >= 2:  # Eq. 7 needs two rates
            law = fit_worker_law(al["rate"].tolist(), al["workers"].tolist())
            head["worker_law"][sc.name] = {
                "k5": law.k5,
                "c5": law.c5,
                "max_miss_workers": law.max_miss,
                "predicted": {str(r): law.predict(r) * sc.tp for r in al["rate"]},
                "simulated": {str(r): int(g) for r, g in zip(al["rate"], al["gpus"], strict=True)},
            }
        top = d[d["rate"] == max(plan.rates)].set_index("arm")["gpus"]
        ours: dict[str, float] = {}
        for ref, prefix in (("aladdin", "vs"), ("aladdin-split", "split vs")):
            split = ref == "aladdin-split"
            if ref in top.index:
                ours |= {
                    f"{prefix} {b}": float(top[ref] / top[b] - 1)
                    for b in top.index
                    if b != ref and b.endswith("-split") == split
                }
        head["ours"][sc.name] = ours
    df.to_csv(out / "gpus.csv", index=False)
    (out / "headline.json").write_text(json.dumps(head, indent=2))
    from sloserve.experiments.aladdin.figures import gpus_figure

    gpus_figure(df, out / "gpus_vs_rate.png")
    return Reproduction(df, head)
