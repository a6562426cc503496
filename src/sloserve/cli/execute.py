"""CLI commands of execute mode: ``calibrate``, and the options ``simulate --executor
torch`` shares (registered on import by ``sloserve.cli``).

``sloserve simulate --executor torch --model-spec tiny`` runs the simulation loop with
every iteration a real forward pass; ``sloserve calibrate --executor torch --model-spec
llama-2-7b --device cuda --out my.yaml`` measures execute mode's iterations over a grid and
writes a fitted profile YAML for ``--profile my.yaml``. PyTorch loads only here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from sloserve.cli._app import app, console
from sloserve.cli._bounded import bounded
from sloserve.core.bounds import Count, Index
from sloserve.core.errors import SloserveError

ModelSpecOpt = Annotated[
    str | None,
    typer.Option(
        "--model-spec",
        help="Execute mode: 'tiny' (2 layers) or a catalog model, random weights.",
    ),
]
ModelPathOpt = Annotated[
    str | None,
    typer.Option("--model", help="Execute mode: a local Llama-family checkpoint directory."),
]
DeviceOpt = Annotated[str, typer.Option("--device", help="Execute mode: cpu or cuda.")]
DtypeOpt = Annotated[
    str | None,
    typer.Option("--dtype", help="float32 (CPU default), bfloat16 (CUDA default), float16."),
]


def check_executor(executor: str) -> bool:
    """True for ``torch``, False for ``cost-model``; one-line error otherwise."""
    if executor not in ("cost-model", "torch"):
        raise SloserveError(f"--executor: expected cost-model or torch, got {executor!r}")
    return executor == "torch"


def load(model_spec: str | None, model: str | None, device: str, dtype: str | None) -> Any:
    """The model to execute (errors are one line: missing checkpoint, no CUDA, too big)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SloserveError(
            "execute mode needs PyTorch: pip install 'sloserve[profile,execute]'"
        ) from None
    from sloserve.engine.execute import load_model

    return load_model(model_spec=model_spec, model_path=model, device=device, dtype=dtype)


def print_timing(summary: dict[str, Any]) -> None:
    """The measured-vs-predicted table of an execute run."""
    from rich.table import Table

    ex = summary["execute"]
    t = Table(
        f"{ex['model']} on {ex['device']} ({ex['dtype']}), predicted by {summary['profile']}",
        "iterations",
        "median measured ms",
        "median predicted ms",
        "median rel err",
        "p90 rel err",
    )
    for kind, r in ex["timing"].items():
        t.add_row(
            kind,
            str(r["iterations"]),
            f"{r['median_measured_s'] * 1e3:.2f}",
            f"{r['median_predicted_s'] * 1e3:.2f}",
            f"{r['median_rel_err']:.1%}",
            f"{r['p90_rel_err']:.1%}",
        )
    console.print(t)


@app.command("calibrate")
def calibrate_cmd(
    out: Annotated[Path, typer.Option("--out", help="Profile YAML to write (CSV beside it).")],
    executor: Annotated[str, typer.Option("--executor", help="torch (the only one).")] = "torch",
    model_spec: ModelSpecOpt = None,
    model: ModelPathOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    repeats: Annotated[int, bounded(Count, "--repeats", help="Timed runs per shape.")] = 5,
    warmup: Annotated[int, bounded(Index, "--warmup", help="Untimed runs first.")] = 2,
    name: Annotated[str | None, typer.Option("--name", help="Profile name.")] = None,
) -> None:
    """Measure execute mode's iterations over a grid of batch shapes, fit the linear cost
    model and write a profile YAML that `--profile` accepts."""
    if executor != "torch":
        raise SloserveError(f"--executor: calibrate runs the torch executor, got {executor!r}")
    loaded = load(model_spec, model, device, dtype)
    from sloserve.costmodel.fit import format_fit_report
    from sloserve.experiments.execute_calibrate import calibrate

    with console.status("calibrating…"):
        prof, csv = calibrate(loaded, out, warmup=warmup, repeats=repeats, name=name)
    console.print(format_fit_report(prof.fit_report), highlight=False)
    console.print(f"measurements in {csv}; profile written to {out}; use it with --profile {out}")
