"""``sloserve reproduce andes``: Andes §6.3–6.4 in simulation (registered on import by
``sloserve.cli``). Paper: ``/work/shared/papers/andes.txt``; the harness:
:mod:`sloserve.experiments.andes`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sloserve.cli._app import console, reproduce_app
from sloserve.cli._bounded import WorkersOpt, WorkloadSeedOpt, bounded
from sloserve.cli._console import new_table
from sloserve.cli._options import ExecutorOpt
from sloserve.cli._progress import progress_bar
from sloserve.core.bounds import Seconds

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table


@reproduce_app.command("andes")
def reproduce_andes(
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("runs/andes"),
    quick: Annotated[
        bool, typer.Option("--quick", help="Reduced grid on one profile (under 2 minutes).")
    ] = False,
    seed: WorkloadSeedOpt = 0,
    workers: WorkersOpt = None,
    executor: ExecutorOpt = None,
    burstgpt: Annotated[
        Path | None,
        typer.Option("--burstgpt", help="Also replay this BurstGPT CSV (§6.2) for every policy."),
    ] = None,
    paper_scale: Annotated[
        bool,
        typer.Option(
            "--paper-scale",
            help="The paper's setting: Llama-3.1-70B and Phi-3.5-MoE on 8x A100-40GB, Table 2 "
            "lengths unclipped, intensity and duration sweeps.",
        ),
    ] = False,
    cycle: Annotated[
        float | None,
        bounded(Seconds, "--cycle", help="Seconds of one burst cycle (default: the plan's)."),
    ] = None,
) -> None:
    """Andes §6.3–6.4: cyclic bursts (intensity, duration), Poisson load, and the refiner,
    solver and Δt ablations; plots, a table and the headline numbers beside the paper's."""
    from dataclasses import replace

    from sloserve.core.errors import ConfigError
    from sloserve.experiments.andes import Plan, reproduce
    from sloserve.experiments.andes.tables import (
        ablation_table,
        headline_table,
        policy_table,
        sustained_table,
    )
    from sloserve.experiments.executor import make_executor

    if quick and paper_scale:
        raise ConfigError("--quick and --paper-scale: choose one")
    plan = Plan.paper(seed) if paper_scale else Plan.quick(seed) if quick else Plan.full(seed)
    if cycle is not None:
        plan = replace(plan, cycle_s=cycle)
    with make_executor(executor, workers) as ex, progress_bar("andes runs") as bar:
        rep = reproduce(
            plan,
            out,
            workers=workers,
            executor=ex,
            progress=bar,
            burstgpt=str(burstgpt) if burstgpt is not None else None,
        )
    scale = "paper-scale" if paper_scale else "quick" if quick else "full"
    console.print(_caption(plan, scale), style="dim", highlight=False, soft_wrap=True)
    console.print(_table(policy_table(rep.results), "Mean QoE by policy (averaged over the knob)"))
    ablations = ablation_table(rep.results)
    if len(ablations):
        console.print(_table(ablations, "Andes ablations: mean QoE and preemptions per request"))
    console.print(
        _table(
            sustained_table(rep.headline), "Largest burst intensity sustained at mean QoE >= 0.95"
        )
    )
    cap = new_table("scenario", "requests/s", title="Capacity without bursts (vLLM, all queued)")
    for scen, v in rep.capacity.items():
        cap.add_row(scen, f"{v:.2f}")
    console.print(cap)
    console.print(_table(headline_table(rep.headline), "Headline numbers: ours and the paper's"))
    console.print(f"results, plots and headline.json written to {out}", highlight=False)


def _caption(plan: Any, scale: str) -> str:
    """What ran, in one line (the echo every command gives)."""
    from sloserve.experiments.andes.plan import POLICIES

    scen = ", ".join(f"{s.profile} / {s.mix}" for s in plan.scenarios)
    return (
        f"{scale} plan | scenarios {scen} | policies "
        f"{', '.join(POLICIES)} | cyclic bursts over {plan.cycle_s:g} s | SLO: QoE "
        f"(Andes' reading-speed expectation) | C {plan.max_batch_tokens:,} tokens | seed "
        f"{plan.seed}"
    )


def _table(df: pd.DataFrame, title: str) -> Table:
    """A data frame as a rich table: text left, numbers right at 3 decimals, NaN as '-'."""
    import pandas as pd

    t = new_table(title=title)
    for c in df.columns:
        numeric = pd.api.types.is_numeric_dtype(df[c])
        t.add_column(str(c).replace("_", " "), justify="right" if numeric else "left")
    for row in df.itertuples(index=False):
        t.add_row(*(_cell(v) for v in row))
    return t


def _cell(v: object) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.3f}"
    return str(v)
