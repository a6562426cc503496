"""Running the Andes reproduction (Andes §6.3–§6.4) and its headline numbers.

Headline numbers, next to the paper's (quoted from Andes §6.3):

* the largest mean-QoE ratio Andes / vLLM over the intensity and duration sweeps (paper: up
  to 4.7× and 3.5×), and that ratio's mean over each sweep;
* the largest burst intensity each policy sustains at mean QoE >= 0.95, and the GPU
  savings it implies, ``1 − I_vllm / I_andes`` (paper: 2.6× the intensity, up to 61% fewer
  GPUs);
* the share of the ideal gain realised: Andes' ideal gain is the server's token delivery
  speed over the reader's speed (§2.3; 2.3× in the paper's setting), the realised gain the
  ratio of sustainable intensities (paper: 1.4×, about 60% of the ideal).

``quick`` runs a reduced grid on one profile in under 2 minutes (for CI); the full run uses
two profiles and two Andes Table 2 length distributions and runs in parallel processes;
``paper`` runs the paper's models on its testbed (:meth:`~.plan.Plan.paper`). The claims
``sloserve reproduce all`` sets beside ours are in :mod:`.claims`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sloserve.core.errors import ConfigError
from sloserve.experiments.andes.figures import plot
from sloserve.experiments.andes.plan import POLICIES, Plan, Run, Scenario, burstgpt_runs, plan_runs
from sloserve.experiments.executor import Executor, as_executor
from sloserve.experiments.report import jsonable
from sloserve.experiments.runner import InstanceConfig, SimConfig, saturation_throughput, simulate
from sloserve.workloads import WorkloadSpec
from sloserve.workloads.arrivals import ConstantArrivals

PAPER = {
    "qoe_ratio_vs_vllm_intensity": 4.7,
    "qoe_ratio_vs_vllm_duration": 3.5,
    "intensity_ratio_at_qoe_0.95": 2.6,
    "gpu_savings_at_qoe_0.95": 0.61,
    "ideal_gain": 2.3,
    "realised_gain": 1.4,
    "realised_share_of_ideal": 0.6,
}


def throughput(
    scenario: Scenario,
    *,
    n: int = 400,
    seed: int = 0,
    max_running: int = 256,
    max_batch_tokens: int = 4096,
) -> float:
    """Requests/s vLLM completes when ``n`` requests of the mix are all queued at once."""
    if max_batch_tokens == 4096:
        return saturation_throughput(
            scenario.mix, scenario.profile, n=n, seed=seed, max_running=max_running
        )
    # the same measurement with the plan's C (the shared helper fixes C at its default)
    cfg = SimConfig(
        workload=WorkloadSpec(
            mix=scenario.mix,
            arrival=ConstantArrivals(rate=1e6),
            num_requests=n,
            duration_s=None,
            seed=seed,
        ),
        instance=InstanceConfig(
            profile=scenario.profile, max_running=max_running, max_batch_tokens=max_batch_tokens
        ),
        policy="vllm",
    )
    s = simulate(cfg).summary
    return float(s["finished"] / s["simulated_seconds"])


def execute(run: Run) -> dict[str, Any]:
    """Simulate one run (one cycle of arrivals, then drain); a row of results."""
    cfg = run.config()
    t0 = time.perf_counter()
    res = simulate(cfg)
    s = res.summary
    gen = res.table["generated_tokens"].to_numpy()
    # token delivery speed per request after its first token (Andes' TDS)
    tpot = res.table["tpot_s"].to_numpy(dtype=np.float64)
    tds = float(np.nanmean(1.0 / tpot[tpot > 0])) if np.any(tpot > 0) else float("nan")
    return {
        "experiment": run.experiment,
        "profile": run.scenario.profile,
        "mix": run.scenario.mix,
        "policy": run.policy,
        "label": run.label,
        "params": json.dumps(dict(run.params)),
        "x": run.x,
        "requests": s["requests"],
        "finished": s["finished"],
        "qoe_mean": s["qoe_mean"],
        "qoe_perfect_fraction": s["qoe_perfect_fraction"],
        "ttft_mean": s["ttft_mean"],
        "ttft_p99": s["ttft_p99"],
        "tpot_mean": s["tpot_mean"],
        "tds_mean": tds,
        "preemptions_per_request": s["preemptions"] / max(1, s["requests"]),
        "tokens": int(gen.sum()),
        "simulated_s": s["simulated_seconds"],
        "wall_s": time.perf_counter() - t0,
    }


@dataclass
class Reproduction:
    results: pd.DataFrame
    capacity: dict[str, float]
    headline: dict[str, Any] = field(default_factory=dict)


def _max_sustained(df: pd.DataFrame, threshold: float = 0.95) -> float:
    """The largest x at which mean QoE >= threshold, interpolated between grid points."""
    d = df.sort_values("x")
    xs, qs = d["x"].to_numpy(), d["qoe_mean"].to_numpy()
    if len(xs) == 0 or qs[0] < threshold:
        return float("nan")
    best = float(xs[0])
    for (x0, q0), (x1, q1) in zip(
        zip(xs, qs, strict=True), zip(xs[1:], qs[1:], strict=True), strict=False
    ):
        if q1 >= threshold:
            best = float(x1)
            continue
        if q0 >= threshold > q1:
            best = float(x0 + (q0 - threshold) / (q0 - q1) * (x1 - x0))
        break
    return best


def headline(results: pd.DataFrame, reading_speed: float = 4.8) -> dict[str, Any]:
    """Our headline numbers beside the paper's, per scenario and overall."""
    out: dict[str, Any] = {"paper": PAPER, "scenarios": {}}
    best: dict[str, float] = {}
    for (profile, mix), g in results.groupby(["profile", "mix"]):
        key = f"{profile}/{mix}"
        row: dict[str, Any] = {}
        for exp in ("intensity", "duration"):
            e = g[g["experiment"] == exp]
            piv = e.pivot_table(index="x", columns="policy", values="qoe_mean")
            if {"andes", "vllm"} <= set(piv.columns):
                ratios = piv["andes"] / piv["vllm"]
                ratio = ratios.max()
                row[f"qoe_ratio_vs_vllm_{exp}"] = float(ratio)
                row[f"qoe_ratio_vs_vllm_{exp}_mean"] = float(ratios.mean())
                best[f"qoe_ratio_vs_vllm_{exp}"] = max(
                    best.get(f"qoe_ratio_vs_vllm_{exp}", 0.0), float(ratio)
                )
        e = g[g["experiment"] == "intensity"]
        sustained = {
            p: _max_sustained(e[e["policy"] == p]) for p in POLICIES if (e["policy"] == p).any()
        }
        row["max_intensity_at_qoe_0.95"] = sustained
        ia, iv = sustained.get("andes", math.nan), sustained.get("vllm", math.nan)
        if iv == iv and ia == ia and iv > 0:
            row["intensity_ratio_at_qoe_0.95"] = ia / iv
            row["realised_gain"] = ia / iv
            row["gpu_savings_at_qoe_0.95"] = 1 - iv / ia
        # ideal gain (§2.3): vLLM's token delivery speed under the default burst / reading speed
        base = g[(g["experiment"] == "intensity") & (g["policy"] == "vllm")]
        if len(base):
            tds = float(base.sort_values("x")["tds_mean"].iloc[0])
            row["vllm_tds_tokens_per_s"] = tds
            row["ideal_gain"] = tds / reading_speed
            if "intensity_ratio_at_qoe_0.95" in row:
                row["realised_share_of_ideal"] = (
                    row["intensity_ratio_at_qoe_0.95"] / row["ideal_gain"]
                )
        ref = g[g["experiment"] == "refiner"]
        if len(ref):
            row["preemptions_per_request"] = (
                ref.groupby("label")["preemptions_per_request"].mean().to_dict()
            )
            row["qoe_refiner"] = ref.groupby("label")["qoe_mean"].mean().to_dict()
        sol = g[g["experiment"] == "solver"]
        if len(sol):
            row["qoe_solver"] = sol.groupby("label")["qoe_mean"].mean().to_dict()
        dts = g[g["experiment"] == "delta_t"]
        if len(dts):
            row["qoe_delta_t"] = dts.groupby("x")["qoe_mean"].mean().to_dict()
        out["scenarios"][key] = row
    out["ours"] = best
    return out


def reproduce(
    plan: Plan,
    out: str | Path,
    *,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    burstgpt: str | None = None,
    executor: Executor | str | None = None,
) -> Reproduction:
    """Run the grid (on ``executor``: an :class:`~sloserve.experiments.executor.Executor`
    or its name, default local processes, ``workers`` of them), write results, plots and
    the headline table. With ``burstgpt`` (a BurstGPT CSV), also replay that real trace for
    every policy."""
    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{out_dir}: cannot create the output folder ({e.strerror})") from e
    capacity = {
        sc: throughput(
            sc, seed=plan.seed, max_running=plan.max_running, max_batch_tokens=plan.max_batch_tokens
        )
        for sc in plan.scenarios
    }
    runs = plan_runs(plan, capacity)
    if burstgpt is not None:
        from sloserve.workloads.loaders import load_burstgpt

        load_burstgpt(burstgpt)  # fail now, with the file's own error, not in a worker
        runs += burstgpt_runs(plan, burstgpt)
    ex, owned = as_executor(executor, workers)

    def on_done(k: int, _row: dict[str, Any]) -> None:
        done[0] += 1
        if progress:
            progress(done[0], len(runs))

    done = [0]
    try:
        rows = ex.map(execute, runs, on_done=on_done)
    finally:
        if owned:
            ex.close()
    results = pd.DataFrame(rows)
    results.to_parquet(out_dir / "results.parquet", index=False)
    cap = {f"{sc.profile}/{sc.mix}": v for sc, v in capacity.items()}
    rep = Reproduction(results, cap, headline(results))
    rep.headline["capacity_requests_per_s"] = cap
    (out_dir / "headline.json").write_text(json.dumps(jsonable(rep.headline), indent=2) + "\n")
    plot(results, out_dir)
    return rep
