"""``sloserve reproduce andes``: Andes §6.3–6.4 in simulation (registered on import by
``sloserve.cli``). Paper: ``/work/shared/papers/andes.txt``; the harness:
:mod:`sloserve.experiments.andes`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from sloserve.cli._app import ExecutorOpt, console, reproduce_app
from sloserve.cli._bounded import bounded
from sloserve.core.bounds import Seed, Workers


@reproduce_app.command("andes")
def reproduce_andes(
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("runs/andes"),
    quick: Annotated[
        bool, typer.Option("--quick", help="Reduced grid on one profile (under 2 minutes).")
    ] = False,
    seed: Annotated[int, bounded(Seed, "--seed", help="Workload seed.")] = 0,
    workers: Annotated[
        int | None, bounded(Workers, "--workers", help="Parallel processes (default: cores).")
    ] = None,
    executor: ExecutorOpt = None,
    burstgpt: Annotated[
        Path | None,
        typer.Option("--burstgpt", help="Also replay this BurstGPT CSV (§6.2) for every policy."),
    ] = None,
) -> None:
    """Andes §6.3–6.4: cyclic bursts (intensity, duration), Poisson load, and the refiner,
    solver and Δt ablations; plots, a table and the headline numbers beside the paper's."""
    from sloserve.experiments.andes import PAPER, Plan, reproduce, summary_table
    from sloserve.experiments.executor import make_executor

    plan = Plan.quick(seed) if quick else Plan.full(seed)
    with make_executor(executor, workers) as ex, console.status("simulating…") as status:

        def progress(done: int, total: int) -> None:
            status.update(f"simulating… {done}/{total} runs")

        rep = reproduce(
            plan,
            out,
            workers=workers,
            executor=ex,
            progress=progress,
            burstgpt=str(burstgpt) if burstgpt is not None else None,
        )
    table = summary_table(rep.results)
    console.print(table.to_string(), highlight=False)
    console.print(f"capacity (requests/s without bursts): {rep.capacity}")
    t = Table("headline", "ours", "paper")
    for key, paper in PAPER.items():
        vals = [
            sc.get(key)
            for sc in rep.headline["scenarios"].values()
            if isinstance(sc.get(key), float)
        ]
        ours = f"{max(vals):.2f}" if vals else "-"
        t.add_row(key, ours, f"{paper:g}")
    console.print(t)
    console.print(f"results, plots and headline.json written to {out}")
