"""``sloserve reproduce bros``: BROS §7 in simulation (registered on import by ``sloserve.cli``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from pydantic import Field

from sloserve.cli._app import console, reproduce_app
from sloserve.cli._bounded import WorkersOpt, WorkloadSeedOpt, bounded
from sloserve.cli._console import new_table
from sloserve.cli._options import ExecutorOpt
from sloserve.cli._progress import progress_bar
from sloserve.core.bounds import MAX_SECONDS, Count
from sloserve.core.errors import ConfigError


def _names(raw: str | None, flag: str) -> list[str] | None:
    if raw is None:
        return None
    names = list(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    if not names:
        raise ConfigError(f"{flag}: expected a comma-separated list of names, got {raw!r}")
    return names


def _floats(raw: str, flag: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in (_names(raw, flag) or []))
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated numbers, got {raw!r}") from None
    if any(not (v > 0 and math.isfinite(v)) for v in vals):
        raise ConfigError(f"{flag}: every value must be a finite number > 0, got {raw!r}")
    return vals


def _fmt(v: object) -> str:
    if not isinstance(v, float):
        return "-"
    if math.isinf(v):
        return "inf (baseline 0)"
    if math.isnan(v):
        return "-"
    return f"{v:.3g}"


# The plan's BE batches last at least 0.1 s of the replica's BE capacity.
BatchSeconds = Annotated[float, Field(ge=0.1, le=MAX_SECONDS, allow_inf_nan=False)]


@reproduce_app.command("bros")
def reproduce_bros(
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("runs/bros"),
    quick: Annotated[
        bool, typer.Option("--quick", help="Reduced grid (under 2 minutes on 2 cores).")
    ] = False,
    seed: WorkloadSeedOpt = 0,
    workers: WorkersOpt = None,
    executor: ExecutorOpt = None,
    policies: Annotated[
        str | None,
        typer.Option(
            "--policies",
            help="Comma-separated subset of bros, bros-nobicache, vllm, rr, sarathi "
            "(default: all; each experiment keeps the ones it uses).",
        ),
    ] = None,
    profiles: Annotated[
        str | None,
        typer.Option(
            "--profiles",
            help="Comma-separated replica profiles (default: the plan's); the ablation runs "
            "on the last one, the overhead benchmark on the first.",
        ),
    ] = None,
    loads: Annotated[
        str | None,
        typer.Option(
            "--loads",
            help="Comma-separated RT rates as fractions of the RT capacity, e.g. 0.2,0.4.",
        ),
    ] = None,
    be_batch_size: Annotated[
        int | None,
        bounded(Count, "--be-batch-size", help="BE requests per closed-loop batch (fixed size)."),
    ] = None,
    be_batch_seconds: Annotated[
        float | None,
        bounded(
            BatchSeconds,
            "--be-batch-seconds",
            help="BE batch size in seconds of the replica's BE capacity (default: the plan's).",
        ),
    ] = None,
    keep_going: Annotated[
        bool,
        typer.Option(
            "--keep-going", help="Record a failing run (policy violation, stall) and go on."
        ),
    ] = False,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration", min=1.0, help="Arrival window in seconds (default: the plan's)."
        ),
    ] = None,
) -> None:
    """BROS §7: hybrid RT/BE workloads (ShareGPT and LMSYS RT at Poisson rates, closed-loop
    BE batches), the pure-RT microbenchmark, the bidirectional-KV ablation and the scheduling
    overhead; plots, a table and the headline numbers beside the paper's."""
    from dataclasses import replace

    from sloserve.experiments.bros import (
        GAPS,
        PAPER,
        Plan,
        Scenario,
        be_batch_table,
        reproduce,
        summary_table,
    )

    plan = Plan.quick(seed) if quick else Plan.full(seed)
    chosen = _names(policies, "--policies")
    if chosen is not None:
        known = set(plan.policies())
        unknown = [p for p in chosen if p not in known]
        if unknown:
            raise ConfigError(
                f"--policies: {', '.join(unknown)} not in this reproduction; "
                f"valid: {', '.join(plan.policies())}"
            )
        plan = plan.with_policies(chosen)
    chosen_profiles = _names(profiles, "--profiles")
    if chosen_profiles is not None:
        mixes = list(dict.fromkeys(sc.mix for sc in plan.scenarios))
        ablation_mixes = list(dict.fromkeys(sc.mix for sc in plan.ablation_scenarios))
        plan = replace(
            plan,
            scenarios=tuple(Scenario(p, m) for p in chosen_profiles for m in mixes),
            # the last profile named: the largest model, by the plans' convention
            ablation_scenarios=tuple(Scenario(chosen_profiles[-1], m) for m in ablation_mixes),
            overhead_profile=chosen_profiles[0],
        )
    if duration is not None:
        plan = replace(plan, duration_s=duration)
    if loads is not None:
        plan = replace(plan, loads=_floats(loads, "--loads"))
    if be_batch_size is not None:
        plan = replace(plan, be_batch_size=be_batch_size)
    if be_batch_seconds is not None:
        plan = replace(plan, be_batch_s=be_batch_seconds, be_batch_size=None)

    from sloserve.experiments.executor import make_executor

    with make_executor(executor, workers) as ex, progress_bar("bros runs") as bar:
        rep = reproduce(
            plan, out, workers=workers, progress=bar, keep_going=keep_going, executor=ex
        )
    scen = ", ".join(f"{sc.profile} / {sc.mix}" for sc in plan.scenarios)
    console.print(
        f"scenarios {scen} | policies {', '.join(plan.hybrid_policies)} | RT loads "
        f"{', '.join(f'{x:g}' for x in plan.loads)} | {plan.duration_s:g} s | SLO bros "
        f"(RT TTFT <= 0.4 s, TPOT <= 0.2 s) | seed {plan.seed}",
        style="dim",
        highlight=False,
        soft_wrap=True,
    )
    if len(rep.results):
        table = summary_table(rep.results)
        present = set(table.index.get_level_values("experiment"))
        for exp in [e for e in ("hybrid", "micro", "ablation") if e in present]:
            part = table[table.index.get_level_values("experiment") == exp]
            part = part.droplevel("experiment").dropna(axis=1, how="all")
            console.print(f"[bold]{exp}[/bold] (mean over RT rates)")
            console.print(part.to_string(), highlight=False)
    if len(rep.results) and (rep.results["experiment"] == "be_batch").any():
        console.print("[bold]be_batch[/bold] (sensitivity to the BE batch size, ours)")
        console.print(be_batch_table(rep.results).to_string(), highlight=False)
    if len(rep.overhead):
        cols = ["policy", "queued", "schedule_ms_mean", "iteration_ms_mean", "overhead_fraction"]
        console.print(rep.overhead[cols].round(4).to_string(index=False), highlight=False)
    caps = {k: round(v, 2) for k, v in rep.capacity.items()}
    console.print(f"RT capacity (requests/s, vLLM, all queued): {caps}", highlight=False)
    ours = rep.headline["ours"]
    t = new_table("headline", "ours", "paper")
    for key, paper in PAPER.items():
        t.add_row(key, _fmt(ours.get(key)), f"{paper:g}")
    console.print(t)
    console.print("Why ours differ (see the README's 'Reproducing BROS'):", highlight=False)
    for gap in GAPS:
        console.print(f"  - {gap}", highlight=False)
    for msg in rep.failed:
        console.print(f"FAILED (left out of the averages): {msg}", style="red", highlight=False)
    console.print(f"results, plots and headline.json written to {out}", highlight=False)
