"""``sloserve reproduce qlm``: QLM §8 in simulation (registered on import by
``sloserve.cli``). Paper: ``/work/shared/papers/qlm.txt``; the harness:
:mod:`sloserve.experiments.qlm`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from sloserve.cli._app import console, reproduce_app
from sloserve.cli._bounded import WorkloadSeedOpt
from sloserve.cli._console import new_table
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
        sweep_table,
        system_table,
    )

    plan = Plan.quick(seed) if quick else Plan.full(seed)
    with progress_bar("qlm runs") as bar:
        rep = reproduce(plan, out, progress=bar)
    t = new_table(title="Deadline attainment and throughput by workload and system")
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
    g = new_table(title="Group size trade-off (QLM on W_B)")
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
    b = new_table(title="Burstiness (W_B, inter-arrival CV; 1 = Poisson)")
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
    w = new_table(title="Sweeps (§8.3): queue = W_B rate, tail = W_A tail share, a10 = A10 share, "
              "mega = W_C mega-prompt share")  # fmt: skip
    for c in ("sweep", "x", "system", "attain", "rt", "tokens/s"):
        w.add_column(c)
    for r in sweep_table(rep.results).itertuples():
        w.add_row(
            str(r.sweep),
            f"{r.x:g}",
            str(r.system),
            f"{r.attainment:.3f}",
            f"{r.attainment_rt:.3f}",
            f"{r.throughput_tokens_per_s:.0f}",
        )
    console.print(w)
    h = new_table(title="Headline: ours vs the paper")
    for c in ("claim", "setting", "ours", "paper", "reproduced"):
        h.add_column(c)
    for c in rep.headline["claims"]:
        ours = c["ours"]
        if c["unit"] == "relative gain":
            shown = _pct(ours)
        else:
            shown = f"{ours:.3g}" if isinstance(ours, float) else "-"
        ok = {True: "yes", False: "no", None: "-"}[c["reproduced"]]
        h.add_row(c["claim"], c["setting"], shown, c["paper"], ok)
    v = rep.headline["values"]
    for label, key in (
        ("attainment vs our best baseline, W_A", "attainment_gain_vs_best_baseline_W_A"),
        ("attainment vs our best baseline, W_B queued",
         "attainment_gain_vs_best_baseline_W_B_queued"),
        ("attainment vs the paper's baselines, W_B unqueued", "attainment_gain_vs_naive_swap_W_B"),
        ("eviction, W_B unqueued", "eviction_attainment_gain_W_B"),
    ):  # fmt: skip
        h.add_row(label, "", _pct(v.get(key)), "", "")
    console.print(h)
    console.print(f"results, figures and headline.json in {out}", style="dim")
