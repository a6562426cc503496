"""``sloserve reproduce all``: the five papers' reproductions and one headline table
(registered on import by ``sloserve.cli``). The work is
:func:`sloserve.experiments.headline.reproduce_all`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sloserve.cli._app import console, err_console, reproduce_app
from sloserve.cli._bounded import WorkloadSeedOpt
from sloserve.cli._console import new_table
from sloserve.core.errors import ConfigError


@reproduce_app.command("all")
def reproduce_all_command(
    out: Annotated[
        Path, typer.Option("--out", help="Output folder (one sub-folder per paper).")
    ] = Path("runs"),
    quick: Annotated[
        bool, typer.Option("--quick", help="Each reproduction's reduced grid.")
    ] = False,
    seed: WorkloadSeedOpt = 0,
    only: Annotated[
        str | None,
        typer.Option("--only", help="Comma-separated papers: andes, qlm, infermax, bros, aladdin."),
    ] = None,
) -> None:
    """Run the reproductions of Andes, QLM, InferMax, BROS and Aladdin, then write
    headline.md and headline.json: each paper's headline claims, ours beside them, the
    ratio, and whether we reach the sign and at least half the size."""
    from sloserve.experiments.headline import PAPERS, reproduce_all

    papers = PAPERS
    if only is not None:
        papers = tuple(p.strip() for p in only.split(",") if p.strip())
        if not papers or any(p not in PAPERS for p in papers):
            raise ConfigError(f"--only: {only!r}; valid: {', '.join(PAPERS)}")

    def progress(paper: str, status: str) -> None:
        console.print(f"{paper}: {status}", style="dim", highlight=False)

    console.print(
        f"{'quick' if quick else 'full'} reproductions of {', '.join(papers)} | seed {seed} "
        f"| output {out}",
        style="dim",
        highlight=False,
        soft_wrap=True,
    )
    h = reproduce_all(out, quick=quick, seed=seed, papers=papers, progress=progress)
    t = new_table(
        "paper", "claim", "paper", "ours", "ratio", "sign", "half", title="Headline claims"
    )
    for row in h.to_json()["claims"]:
        pct = row["unit"] == "%"

        def fmt(v: float | None, pct: bool = pct) -> str:
            if v is None:
                return "-"
            return f"{v * 100:.1f}%" if pct else f"{v:.2f}x"

        t.add_row(
            row["paper"],
            row["text"],
            fmt(row["paper_value"]),
            fmt(row["ours"]),
            "-" if row["ratio"] is None else f"{row['ratio']:.2f}",
            {None: "-", True: "yes", False: "no"}[row["sign"]],
            {None: "-", True: "yes", False: "no"}[row["half_size"]],
        )
    console.print(t)
    console.print(
        f"wall time {h.total_wall_s:.0f} s ("
        + ", ".join(f"{p} {s:.0f} s" for p, s in h.wall_s.items())
        + f"); headline.md and headline.json written to {out}",
        highlight=False,
        soft_wrap=True,
    )
    for p, e in h.errors.items():
        err_console.print(f"{p} failed: {e} (traceback in {out / p / 'error.txt'})")
    if h.errors:
        raise typer.Exit(1)
