"""CLI commands: the ``workload`` group (registered on import by ``sloserve.cli``).

``sloserve workload describe`` prints a workload's statistics (optionally a plot) and
``sloserve workload export`` writes it as a trace CSV; both take the same workload settings
as ``simulate``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from sloserve.cli._app import _build_config, app, console
from sloserve.cli._bounded import bounded
from sloserve.cli._console import new_table
from sloserve.cli._options import _WORKLOAD_FLAGS, ConfigOpt, _with_flags
from sloserve.core.bounds import Seconds

workload_app = typer.Typer(
    help="Inspect and export workloads (the same settings as simulate).", no_args_is_help=True
)
app.add_typer(workload_app, name="workload")


def _workload_from_flags(config: Path | None, flags: dict[str, Any]) -> Any:
    from sloserve.experiments.runner import workload_of

    cfg, _ = _build_config({}, config, flags)
    return workload_of(cfg)


@workload_app.command("describe")
@_with_flags(*_WORKLOAD_FLAGS, "profile")
def workload_describe(
    config: ConfigOpt = None,
    bin_s: Annotated[
        float | None, bounded(Seconds, "--bin", help="Rate-over-time bin width (s).")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG of rate and lengths.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the statistics as JSON.")] = False,
    *,
    flags: dict[str, Any],
) -> None:
    """Print a workload's statistics: count, rate over time, length percentiles, classes."""
    from sloserve.experiments.report import jsonable
    from sloserve.workloads.describe import describe, plot_workload

    wl = _workload_from_flags(config, flags)
    stats = describe(wl.requests, bin_s=bin_s)
    stats["notes"] = wl.notes
    if wl.batch_jobs is not None:
        stats["notes"] = [
            *wl.notes,
            "closed-loop batch jobs are submitted during a run: not counted here",
        ]
    if plot is not None:
        plot_workload(wl.requests, plot, bin_s=bin_s)
    if as_json:
        sys.stdout.write(json.dumps(jsonable(stats), indent=2) + "\n")
        return
    t = new_table(
        title=f"{stats['requests']} requests over {stats['span_s']:.1f} s", show_header=True
    )
    t.add_column("tokens", no_wrap=True)
    for h in ("mean", "std", "p50", "p90", "p99", "max"):
        t.add_column(h, justify="right", overflow="fold")
    for key in ("prompt_tokens", "output_tokens", "total_tokens"):
        d = stats[key]
        t.add_row(
            key.split("_")[0], *(f"{d[h]:.0f}" for h in ("mean", "std", "p50", "p90", "p99", "max"))
        )
    console.print(t)
    rate = stats["mean_rate_per_s"]
    cv = stats["interarrival_cv"]
    console.print(
        f"mean rate {rate:.3f} req/s" if rate else "all requests arrive at once",
        f"(inter-arrival CV {cv:.2f})" if cv is not None else "",
    )
    rot = stats["rate_over_time"]
    peak = max(rot["rate_per_s"], default=0.0) or 1.0
    if rot["rate_per_s"]:
        console.print(f"rate over time, {rot['bin_s']:g} s bins (req/s):")
    for start, r in zip(rot["start_s"], rot["rate_per_s"], strict=True):
        console.print(f"  {start:>9.0f}  {r:8.3f}  {'#' * round(40 * r / peak)}", highlight=False)
    console.print(
        f"classes: {stats['classes']}  models: {stats['models']}  SLO medians: {stats['slo']}"
    )
    for note in stats["notes"]:
        console.print(f"note: {note}", highlight=False)
    if plot is not None:
        console.print(f"plot written to {plot}")


@workload_app.command("export")
@_with_flags(*_WORKLOAD_FLAGS, "profile")
def workload_export(
    out: Annotated[Path, typer.Option("--out", help="File to write.")],
    config: ConfigOpt = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            metavar="sloserve|vllm-jsonl",
            help="sloserve: trace CSV (replay it exactly with --trace); vllm-jsonl: the "
            "custom dataset `vllm bench serve --dataset-name custom` replays.",
        ),
    ] = "sloserve",
    *,
    flags: dict[str, Any],
) -> None:
    """Write a workload as a trace CSV (replay it exactly later with --trace FILE), or as a
    `vllm bench serve` custom dataset (--format vllm-jsonl)."""
    from sloserve.core.errors import ConfigError, did_you_mean
    from sloserve.workloads.describe import export_trace
    from sloserve.workloads.vllm_export import export_vllm_jsonl

    if fmt not in ("sloserve", "vllm-jsonl"):
        raise ConfigError(
            f"--format: unknown export format {fmt!r}"
            f"{did_you_mean(fmt, ('sloserve', 'vllm-jsonl'))}; valid: sloserve, vllm-jsonl"
        )
    wl = _workload_from_flags(config, flags)
    if fmt == "vllm-jsonl":
        export_vllm_jsonl(wl.requests, out)
        console.print(
            f"{len(wl.requests)} requests written to {out}; replay with: vllm bench serve "
            f"--dataset-name custom --dataset-path {out} --custom-output-len -1 "
            "--ignore-eos --skip-chat-template --disable-shuffle",
            highlight=False,
        )
    else:
        export_trace(wl.requests, out)
        console.print(f"{len(wl.requests)} requests written to {out}")
    if wl.batch_jobs is not None:
        console.print(
            "[yellow]closed-loop batch jobs depend on the server and are not in the file[/yellow]"
        )
    if wl.sessions is not None:
        console.print(
            "[yellow]sessions' later turns arrive closed-loop during a run: only first turns "
            "are in the file[/yellow]"
        )
