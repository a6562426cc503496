"""``sloserve capacity``: the fewest GPUs per rate meeting SLO targets at an attainment
target, or (``--max-rate``) the highest rate a fixed cluster sustains (registered on import
by ``sloserve.cli``; the engine: :mod:`sloserve.experiments.capacity`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from sloserve.cli._app import app, console, err_console
from sloserve.cli._bounded import bounded
from sloserve.cli._console import new_table
from sloserve.cli._options import ExecutorOpt
from sloserve.cli._progress import progress_bar
from sloserve.core.bounds import Count, Fraction, UnitInterval, Workers
from sloserve.core.errors import ConfigError


def _prices(text: str | None) -> dict[str, float] | None:
    """``PROFILE=USD,...`` -> {profile: price per GPU-hour}."""
    if not text:
        return None
    out: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or not name or not 0 <= price <= 1e4:
            raise ConfigError(f"--gpu-price: {item.strip()!r} is not PROFILE=USD (0..1e4)")
        out[name.strip()] = price
    return out


def _router_params(text: str | None) -> dict[str, dict[str, Any]] | None:
    """``ROUTER.KEY=VALUE,...`` -> {router: {key: value}} (values read as YAML scalars)."""
    if not text:
        return None
    import yaml

    from sloserve.core import yamlload

    out: dict[str, dict[str, Any]] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        router, dot, name = key.strip().partition(".")
        if not sep or not dot or not router or not name:
            raise ConfigError(f"--router-params: {item.strip()!r} is not ROUTER.KEY=VALUE")
        try:
            out.setdefault(router, {})[name] = yamlload.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"--router-params: {key}: {value!r} is not a value") from None
    return out


@app.command()
def capacity(
    workload: Annotated[
        Path | None,
        typer.Option(
            "--workload",
            metavar="FILE.yaml",
            help="The traffic: a workload spec (trace, arrival process, length mix, classes) "
            "or a run config with a 'workload:' section.",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            metavar="RUN.yaml",
            help="A run config; with --max-rate its 'cluster:' section is the fixed cluster.",
        ),
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option(
            "--slo",
            metavar="METRIC[_pNN]=T,...",
            help="SLO targets, e.g. ttft_p90=2s,tpot_p90=100ms (metrics: ttft, tpot, e2e, "
            "max_gap). Default: the workload's own per-class SLOs.",
        ),
    ] = None,
    attainment: Annotated[
        float,
        bounded(Fraction, "--attainment", help="Share of requests that must meet the SLO."),
    ] = 0.99,
    profiles: Annotated[
        str | None,
        typer.Option(
            "--profiles",
            metavar="P1,P2",
            help="Replica profiles to search (the TP degree is the profile's; A+B: a "
            "mix of GPU kinds). Default: the config's.",
        ),
    ] = None,
    routers: Annotated[
        str | None,
        typer.Option("--routers", metavar="R1,R2", help="Routers. Default: least-loaded."),
    ] = None,
    policies: Annotated[
        str | None,
        typer.Option(
            "--policies", metavar="P1,P2", help="Per-instance policies. Default: the config's."
        ),
    ] = None,
    layouts: Annotated[
        str | None,
        typer.Option(
            "--layouts",
            metavar="agg,pd:P:D",
            help="Aggregated, and/or disaggregated prefill:decode at ratio P:D. Default: agg.",
        ),
    ] = None,
    rates: Annotated[
        str | None,
        typer.Option(
            "--rates",
            metavar="MIN:MAX[:STEP]|R1,R2",
            help="Arrival rates (req/s), by time-scaling the process or the trace. Default: "
            "the workload's rate.",
        ),
    ] = None,
    max_rate: Annotated[
        bool,
        typer.Option("--max-rate", help="Fixed cluster (--config): find the highest rate."),
    ] = False,
    seeds: Annotated[
        int,
        bounded(Count, "--seeds", help="Seeds per configuration (all must pass)."),
    ] = 3,
    max_replicas: Annotated[
        int,
        bounded(Count, "--max-replicas", help="Largest replica count searched (<= 256)."),
    ] = 32,
    gpu_price: Annotated[
        str | None,
        typer.Option(
            "--gpu-price",
            metavar="PROFILE=USD,...",
            help="Price of a GPU-hour per profile (else the profile's gpu_hour_usd).",
        ),
    ] = None,
    router_params: Annotated[
        str | None,
        typer.Option(
            "--router-params",
            metavar="ROUTER.KEY=VALUE,...",
            help="Router parameters, e.g. aladdin.gamma=1,aladdin.theta=0.5.",
        ),
    ] = None,
    tolerance: Annotated[
        float,
        bounded(Fraction, "--tolerance", help="--max-rate: relative precision of the rate."),
    ] = 0.05,
    no_early_stop: Annotated[
        bool,
        typer.Option("--no-early-stop", help="Run every simulation to its end."),
    ] = False,
    screen: Annotated[
        float,
        bounded(
            UnitInterval,
            "--screen",
            help="Search this first share of a window of >= 240 s first, then verify on the "
            "whole window from that answer (0: off; only whole-window runs decide).",
        ),
    ] = 0.25,
    out: Annotated[
        Path,
        typer.Option("--out", help="Output folder (tables, plots, explain.md, deploy/)."),
    ] = Path("runs/capacity"),
    executor: ExecutorOpt = None,
    workers: Annotated[
        int | None,
        bounded(Workers, "--workers", help="Parallel processes (default: cores)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON summary only (no progress bar).")
    ] = False,
) -> None:
    """Plan capacity from simulated traffic: the fewest GPUs meeting the SLO at each rate
    (over profiles × routers × policies × layouts), or the highest rate a fixed cluster
    sustains; exports the chosen plan as vllm serve lines and a deployment values file."""
    from sloserve.config import read_yaml
    from sloserve.experiments.capacity.run import plan_capacity
    from sloserve.experiments.executor import make_executor
    from sloserve.experiments.report import jsonable

    if (workload is None) == (config is None):
        raise ConfigError("give the traffic with --workload FILE or --config FILE (one of them)")
    source = workload if workload is not None else config
    assert source is not None
    data = read_yaml(source)
    if max_rate and config is None:
        raise ConfigError("--max-rate: give the fixed cluster with --config RUN.yaml")
    wl = data.get("workload", data) if isinstance(data.get("workload"), dict) else data
    seed0 = int(wl.get("seed", 0)) if isinstance(wl, dict) else 0
    done = [0]
    with make_executor(executor, workers) as ex, progress_bar("capacity", as_json=as_json) as bar:

        def progress(_msg: str) -> None:
            done[0] += 1
            bar.stage("simulations", done[0], None)

        res = plan_capacity(
            source,
            slo=slo,
            attainment=attainment,
            profiles=profiles,
            routers=routers,
            policies=policies,
            layouts=layouts,
            rates=rates,
            max_rate=max_rate,
            seeds=tuple(range(seed0, seed0 + seeds)),
            max_replicas=max_replicas,
            prices=_prices(gpu_price),
            router_params=_router_params(router_params),
            tolerance=tolerance,
            early_stop=not no_early_stop,
            screen=screen or None,
            executor=ex,
            out=out,
            progress=progress,
        )
    info = json.loads((out / "capacity.json").read_text())
    if as_json:
        payload: dict[str, Any] = {
            **info,
            "executor": ex.name,
            "answers": res.answers.to_dict("records"),
        }
        sys.stdout.write(json.dumps(jsonable(payload), indent=2) + "\n")
        return
    _print(res, info, out, ex.name)


def _fmt(v: Any, spec: str = ".3g") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _print(res: Any, info: dict[str, Any], out: Path, executor: str) -> None:
    a = res.answers
    if res.question == "max-rate":
        t = new_table(title="Highest sustained rate of the fixed cluster")
        cols = [
            "router",
            "policy",
            "gpus",
            "max_rate",
            "attainment",
            "failing_rate",
            "failing_attainment",
            "monotone",
        ]
    else:
        t = new_table(title="Fewest GPUs meeting the SLO target")
        cols = [
            "profile",
            "router",
            "policy",
            "layout",
            "rate",
            "replicas",
            "gpus",
            "attainment",
            "attainment_spread",
            "neighbour_attainment",
            "usd_per_hour",
            "cost_per_mtok",
            "monotone",
        ]
    heads = {
        "attainment_spread": "spread",
        "neighbour_attainment": "n-1 att.",
        "usd_per_hour": "$/h",
        "cost_per_mtok": "$/Mtok",
        "failing_attainment": "fail att.",
    }
    for c in cols:
        t.add_column(heads.get(c, c), justify="right")
    for r in a.to_dict("records"):
        t.add_row(*(_fmt(r.get(c)) for c in cols))
    console.print(t)
    for c in res.checks:
        err_console.print(f"warning: {c}", highlight=False)
    plan = info.get("plan")
    if plan:
        import pandas as pd

        from sloserve.experiments.capacity.explain import explain_rows
        from sloserve.experiments.capacity.output import chosen

        console.print(f"plan: {plan['title']}", highlight=False)
        for cmd in plan["commands"]:
            console.print(f"  {cmd}", highlight=False, soft_wrap=True)
        row = chosen(res)
        if row is not None:  # why this many: the answer and the configuration below it
            for line in explain_rows(pd.DataFrame([row]), res.question):
                console.print(f"  why: {line.strip().removeprefix('- ')}", highlight=False)
    console.print(
        f"{res.simulations} simulations in {res.rounds} rounds on {executor}, "
        f"{res.wall_s:.1f} s; {', '.join(info['files'])} written to {out}",
        highlight=False,
        soft_wrap=True,
    )
