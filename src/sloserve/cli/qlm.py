"""``sloserve reproduce qlm``: QLM §8 in simulation (registered on import by
``sloserve.cli``). Paper: ``/work/shared/papers/qlm.txt``; the harness:
:mod:`sloserve.experiments.qlm`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sloserve.cli._app import console, reproduce_app
from sloserve.cli._bounded import WorkloadSeedOpt
from sloserve.cli._progress import progress_bar


def _pct(v: Any) -> str:
    if not isinstance(v, float) or math.isnan(v):
        return "-"
    return f"{v:+.0%}"


@reproduce_app.command("qlm")
def reproduce_qlm(
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("runs/qlm"),
    quick: Annotated[
        bool, typer.Option("--quick", help="Reduced grid (about a minute on 2 cores).")
    ] = False,
    seed: WorkloadSeedOpt = 0,
) -> None:
    """QLM §8: multi-model (W_A) and single-model multi-SLO (W_B; W_C mega-prompts in the
    full grid) workloads, QLM vs EDF, FCFS, round-robin and the
    paper's naive-swap vLLM (fcfs-swap, edf-swap), the LSO ablations, the
    group-size trade-off and the plan-generator time; tables, figures and the headline
    numbers beside the paper's."""
    from sloserve.experiments.qlm import (
        Plan,
        burst_table,
        group_size_table,
        reproduce,
        system_table,
    )

    plan = Plan.quick(seed) if quick else Plan.full(seed)
    with progress_bar("qlm runs") as bar:
        rep = reproduce(plan, out, progress=bar)
    t = Table(title="Deadline attainment and throughput by workload and system")
    for c in ("workload", "system", "attain", "rt", "be", "tokens/s", "cold", "warm"):
        t.add_column(c)
    for r in system_table(rep.results).itertuples():
        t.add_row(
            str(r.workload),
            str(r.system),
            f"{r.attainment:.3f}",
            f"{r.attainment_rt:.3f}",
            f"{r.attainment_be:.3f}",
            f"{r.throughput_tokens_per_s:.0f}",
            f"{r.model_loads_cold:.0f}",
            f"{r.model_loads_warm:.0f}",
        )
    console.print(t)
    g = Table(title="Group size trade-off (QLM on W_B)")
    for c in ("group_size_factor", "attainment", "plan calls", "solve s"):
        g.add_column(c)
    for r in group_size_table(rep.results).itertuples():
        g.add_row(
            f"{r.group_size_factor:g}",
            f"{r.attainment:.3f}",
            f"{r.plan_calls:.0f}",
            f"{r.plan_solve_s:.3f}",
        )
    console.print(g)
    b = Table(title="Burstiness (W_B, inter-arrival CV; 1 = Poisson)")
    for c in ("CV", "system", "attain", "rt", "tokens/s"):
        b.add_column(c)
    for r in burst_table(rep.results).itertuples():
        b.add_row(
            f"{r.arrival_cv:g}",
            str(r.system),
            f"{r.attainment:.3f}",
            f"{r.attainment_rt:.3f}",
            f"{r.throughput_tokens_per_s:.0f}",
        )
    console.print(b)
    h = Table(title="Headline: ours vs the paper")
    h.add_column("metric")
    h.add_column("ours")
    h.add_column("paper")
    paper = rep.headline["paper"]
    rows = [
        (
            "attainment vs best baseline, W_A",
            "attainment_gain_vs_best_baseline_W_A",
            "attainment_gain_vs_baselines",
        ),
        (
            "attainment vs best baseline, W_B",
            "attainment_gain_vs_best_baseline_W_B",
            "attainment_gain_vs_baselines",
        ),
        (
            "throughput vs best baseline, W_A",
            "throughput_gain_vs_best_baseline_W_A",
            "throughput_gain_vs_baselines",
        ),
        (
            "throughput vs best baseline, W_B",
            "throughput_gain_vs_best_baseline_W_B",
            "throughput_gain_vs_baselines",
        ),
        *(
            (
                f"{m} vs naive swap (paper's baselines), {wl}",
                f"{m}_gain_vs_naive_swap_{wl}",
                f"{m}_gain_vs_baselines",
            )
            for m in ("attainment", "throughput")
            for wl in ("W_A", "W_B")
        ),
        (
            "warm start: throughput, W_A",
            "warm_start_throughput_gain_W_A",
            "warm_start_throughput_gain_W_A",
        ),
        (
            "eviction: attainment, W_B",
            "eviction_attainment_gain_W_B",
            "eviction_attainment_gain_W_B",
        ),
    ]
    for label, ours, theirs in rows:
        h.add_row(label, _pct(rep.headline.get(ours)), paper[theirs])
    r2 = rep.headline.get("rct_r2_mean")
    h.add_row("RCT R²", f"{r2:.2f}" if isinstance(r2, float) else "-", paper["rct_r2"])
    h.add_row(
        "plan time per request (max)",
        f"{rep.headline['plan_us_per_request_max']:.1f} µs",
        paper["plan_time_per_request"],
    )
    console.print(h)
    console.print(f"results, figures and headline.json in {out}", style="dim")
