"""CLI command ``sloserve reproduce infermax`` (registered on import by ``sloserve.cli``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from sloserve.cli._app import console, reproduce_app
from sloserve.core.errors import ConfigError


@reproduce_app.command("infermax")
def reproduce_infermax(
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("runs/infermax"),
    quick: Annotated[
        bool, typer.Option("--quick", help="Reduced grids (under 2 minutes on 2 cores).")
    ] = False,
    only: Annotated[
        str | None,
        typer.Option(
            "--only",
            help="Comma-separated analyses: contention, eviction, memory, csp, rmax, ranking "
            "(default: all).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the A.3 mixes and the CSP.")] = 0,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers", min=1, help="Parallel processes, and CP-SAT workers (default: cores)."
        ),
    ] = None,
    profile: Annotated[
        str, typer.Option("--profile", help="Replica profile (the paper: Llama-2-7B on A100).")
    ] = "llama-2-7b-a100",
    csp: Annotated[
        bool,
        typer.Option("--csp/--no-csp", help="Solve the §4.5 CSP (else only its presets run)."),
    ] = True,
    csp_time_limit: Annotated[
        float | None,
        typer.Option(
            "--csp-time-limit", help="Seconds per CSP solve, two per I (quick 2, full 10)."
        ),
    ] = None,
) -> None:
    """InferMax §4 and A.3: high contention, eviction-free vs evicting, M sweep, the §4.5
    CSP experiment, R_max sweep and ranking by I vs O; data, plots and a table of our
    numbers beside the paper's findings."""
    from dataclasses import replace

    from sloserve.experiments.infermax_repro import ANALYSES, Plan, reproduce

    analyses = tuple(a.strip() for a in only.split(",") if a.strip()) if only else ANALYSES
    base = Plan.quick if quick else Plan.full
    plan = base(seed, analyses)
    changes: dict[str, object] = {"profile": profile, "csp_solver": csp}
    if csp_time_limit is not None:
        if csp_time_limit <= 0:
            raise ConfigError(f"--csp-time-limit must be > 0, got {csp_time_limit}")
        changes["csp_time_limit_s"] = csp_time_limit
    plan = replace(plan, **changes)  # type: ignore[arg-type]
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        rep = reproduce(plan, out, workers=workers, progress=progress)
    t = Table("§", "finding", "paper", "ours", title="InferMax: the paper's findings and ours")
    for r in rep.findings.itertuples(index=False):
        t.add_row(str(r.section), str(r.finding), str(r.paper), str(r.ours))
    console.print(t)
    if rep.headline.get("csp_note"):
        console.print(f"note: {rep.headline['csp_note']}", highlight=False)
    console.print(
        f"{len(rep.results)} runs; results.parquet, headline.json, findings.md and plots "
        f"written to {out}",
        highlight=False,
    )
