"""CLI commands: simulate, compare and demo (registered on import by ``sloserve.cli``).

``simulate`` runs one policy on one replica, ``compare`` several policies on the very same
requests, ``demo`` the built-in policies on the built-in bursty chat workload; each prints
a summary table (or ``--json``) and optionally writes a report folder (``--out``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sloserve.cli._app import (
    _INSTANCE_FLAGS,
    _WORKLOAD_FLAGS,
    ConfigOpt,
    DurationOpt,
    OutOpt,
    RateOpt,
    SeedOpt,
    _build_config,
    _with_flags,
    app,
    console,
)
from sloserve.config import builtin_config
from sloserve.core.errors import SloserveError


def _summary_table(results: dict[str, Any], title: str) -> Table:
    from sloserve.experiments.report import SUMMARY_COLUMNS, summary_rows

    table = Table(title=title, show_lines=False)
    # Narrow terminals: numbers and headers fold onto more lines, names never get cut.
    table.add_column("policy", style="bold", no_wrap=True)
    for _k, header, _f in SUMMARY_COLUMNS:
        table.add_column(header, justify="right", overflow="fold")
    for row in summary_rows(results):
        table.add_row(*row)
    return table


@app.command()
@_with_flags(*_WORKLOAD_FLAGS, *_INSTANCE_FLAGS)
def simulate(
    config: ConfigOpt = None,
    policy: Annotated[
        str | None, typer.Option("--policy", help="Scheduling policy (see `sloserve policies`).")
    ] = None,
    out: OutOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON summary only.")] = False,
    *,
    flags: dict[str, Any],
) -> None:
    """Simulate one policy on one replica and print its summary."""
    from sloserve.experiments.report import jsonable, write_report
    from sloserve.experiments.runner import simulate as run_one

    cfg, listed = _build_config({}, config, flags)
    if policy is not None:
        cfg = cfg.model_copy(update={"policy": policy})
    elif listed is not None:
        raise SloserveError(
            f"{config}: 'policies' lists several policies; use `sloserve compare`, "
            "or pick one with --policy"
        )
    from sloserve.policies.registry import make_policy

    make_policy(cfg.policy, cfg.policy_params)
    result = run_one(cfg)
    if out is not None:
        write_report({cfg.policy: result}, out)
    if as_json:
        sys.stdout.write(json.dumps(jsonable(result.summary), indent=2) + "\n")
        return
    console.print(
        _summary_table(
            {cfg.policy: result},
            f"{len(result.requests)} requests, "
            f"{result.summary['simulated_seconds']:.0f} s simulated",
        )
    )
    _note_rejections({cfg.policy: result})
    if out is not None:
        console.print(f"report written to {out}")


def _compare(
    base: dict[str, Any],
    config: Path | None,
    flags: dict[str, Any],
    policies: str | None,
    out: Path | None,
    as_json: bool,
) -> None:
    from sloserve.experiments.report import jsonable, write_report
    from sloserve.experiments.runner import compare as run_many

    cfg, listed = _build_config(base, config, flags)
    names = [p.strip() for p in policies.split(",") if p.strip()] if policies else listed
    if not names:
        raise SloserveError("no policies given: use --policies a,b or 'policies:' in the config")
    with console.status(f"simulating {len(names)} policies…") if not as_json else _null():
        results = run_many(cfg, names)
    if out is not None:
        write_report(results, out)
    if as_json:
        sys.stdout.write(
            json.dumps(jsonable({n: r.summary for n, r in results.items()}), indent=2) + "\n"
        )
        return
    first = next(iter(results.values()))
    console.print(
        _summary_table(results, f"{len(first.requests)} requests, same arrivals for every policy")
    )
    _note_rejections(results)
    if out is not None:
        console.print(f"report written to {out}")


def _note_rejections(results: dict[str, Any]) -> None:
    """Say when requests were turned away, and why: a silent drop would mislead."""
    for name, r in results.items():
        rejected = r.table[r.table["status"] == "rejected"]
        if len(rejected):
            why = rejected["reject_reason"].iloc[0]
            console.print(
                f"[yellow]{name}: {len(rejected)} request(s) rejected, e.g. {why}[/yellow]"
            )


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@app.command()
@_with_flags(*_WORKLOAD_FLAGS, *_INSTANCE_FLAGS)
def compare(
    config: ConfigOpt = None,
    policies: Annotated[
        str | None, typer.Option("--policies", help="Comma-separated policies to compare.")
    ] = None,
    out: OutOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON summaries only.")] = False,
    *,
    flags: dict[str, Any],
) -> None:
    """Compare policies on the very same requests; print a table, optionally write a report."""
    _compare({}, config, flags, policies, out, as_json)


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", help="Report folder.")] = Path("runs/demo"),
    config: ConfigOpt = None,
    policies: Annotated[
        str | None,
        typer.Option(
            "--policies",
            help="Comma-separated policies (default: the InferMax family, EDF and ranking).",
        ),
    ] = None,
    duration: DurationOpt = None,
    rate: RateOpt = None,
    seed: SeedOpt = None,
) -> None:
    """Compare the built-in policies on a bursty chat workload (one Llama-2-7B / A100 replica)."""
    flags = {"duration": duration, "rate": rate, "seed": seed}
    _compare(builtin_config("demo"), config, flags, policies, out, False)
