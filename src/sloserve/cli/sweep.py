"""``sloserve sweep``: a YAML grid of runs → one parquet of summaries and a Pareto plot,
resumable (registered on import by ``sloserve.cli``; the engine:
:mod:`sloserve.experiments.sweep`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from sloserve.cli._app import app, console
from sloserve.cli._bounded import bounded
from sloserve.cli._console import new_table
from sloserve.cli._options import ExecutorOpt
from sloserve.cli._progress import progress_bar
from sloserve.core.bounds import Workers


@app.command()
def sweep(
    config: Annotated[
        Path,
        typer.Option(
            "--config",
            metavar="GRID.yaml",
            help="Sweep file: 'base:' (a run config), 'grid:' (dotted config paths -> value "
            "lists, cartesian product) and/or 'points:' (explicit points).",
        ),
    ],
    out: Annotated[
        Path,
        typer.Option("--out", help="Output folder (points.jsonl, summary.parquet, pareto.png)."),
    ] = Path("runs/sweep"),
    executor: ExecutorOpt = None,
    workers: Annotated[
        int | None,
        bounded(Workers, "--workers", help="Parallel processes (default: cores)."),
    ] = None,
    pareto: Annotated[
        str | None,
        typer.Option(
            "--pareto",
            metavar="X,Y",
            help="Two summary metrics for the Pareto plot, each optionally :min or :max "
            "(default: throughput_requests_per_s,ttft_attainment).",
        ),
    ] = None,
    restart: Annotated[
        bool, typer.Option("--restart", help="Rerun every point (forget finished ones).")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON summary only (no progress bar).")
    ] = False,
) -> None:
    """Run a grid of simulations (policies, routers, rates, replicas, profiles, seeds…);
    finished points are skipped on rerun, so a killed sweep resumes where it stopped."""
    from sloserve.experiments.executor import make_executor
    from sloserve.experiments.report import jsonable, run_caption
    from sloserve.experiments.sweep import SweepSpec, run_sweep

    spec = SweepSpec.load(config)
    with make_executor(executor, workers) as ex, progress_bar("sweep", as_json=as_json) as bar:
        res = run_sweep(spec, out, executor=ex, pareto=pareto, restart=restart, progress=bar)
    (x, xd), (y, yd) = res.axes
    run: dict[str, Any] = {
        "points": len(res.table),
        "grid": {k: list(v) for k, v in spec.grid.items()},
        "explicit_points": len(spec.points),
        "base": _base_info(spec.base),
    }
    if as_json:
        info: dict[str, Any] = {
            "run": run,
            "points": len(res.table),
            "ran": res.ran,
            "skipped": res.skipped,
            "executor": ex.name,
            "wall_s": res.wall_s,
            "summary": str(res.out / "summary.parquet"),
            "plot": None if res.plot is None else str(res.plot),
            "pareto_axes": {x: xd, y: yd},
            "pareto_front": res.front.drop(columns=["pareto_front"]).to_dict("records"),
        }
        sys.stdout.write(json.dumps(jsonable(info), indent=2) + "\n")
        return
    base = run["base"]
    console.print(
        f"sweep of {run['points']} points over "
        + (", ".join(spec.grid) or "explicit points")
        + (f" | base: {run_caption(base)}" if base else ""),
        style="dim",
        highlight=False,
        soft_wrap=True,
    )
    params = [c for c in res.table.columns if c in set(spec.grid) | _point_keys(spec)]
    t = new_table(title=f"Pareto front: {x} ({xd}) vs {y} ({yd})")
    for c in [*params, x, y]:
        t.add_column(c, justify="right")
    for r in res.front.to_dict("records"):
        t.add_row(*(_fmt(r.get(c)) for c in [*params, x, y]))
    console.print(t)
    if res.note:
        console.print(f"note: {res.note}", highlight=False)
    console.print(
        f"{len(res.table)} points ({res.ran} run on {ex.name}, {res.skipped} already done) "
        f"in {res.wall_s:.1f} s; summary.parquet"
        + (", pareto.png" if res.plot else "")
        + f" written to {res.out}",
        highlight=False,
    )


def _base_info(base: dict[str, Any]) -> dict[str, Any] | None:
    """What the base config runs (workload, profile, policy, SLOs, seed), or None when it
    is not a single-replica run config (a cluster section: its keys vary per point)."""
    from pydantic import ValidationError

    from sloserve.experiments.report import run_info
    from sloserve.experiments.runner import SimConfig

    try:
        cfg = SimConfig.model_validate({k: v for k, v in base.items() if k != "cluster"})
    except ValidationError:
        return None
    return run_info(cfg)


def _point_keys(spec: Any) -> set[str]:
    return {str(k) for p in spec.points for k in p}


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)
