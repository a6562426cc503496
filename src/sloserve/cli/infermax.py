"""InferMax's CLI commands (``papers/infermax.txt``): ``sloserve optimal`` and ``sloserve
reproduce infermax`` (registered on import by ``sloserve.cli``).

``sloserve optimal`` solves InferMax's CSP (§3.3, ``sloserve.optimal.infermax``) for a small
instance — ``--requests N --input I --output O`` or a slice of a workload/trace (the shared
workload flags; cap it with ``--num-requests``) — replays the solution through the engine to
verify it, and prints the result (``--json`` for the machine-readable summary). ``--replay
FILE`` instead verifies a schedule exported with ``--schedule-out``. OR-Tools loads only
here.

``sloserve reproduce infermax`` runs InferMax §4 and A.3 in simulation
(``sloserve.experiments.infermax``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from sloserve.cli._app import _build_config, app, console, reproduce_app
from sloserve.cli._bounded import bounded
from sloserve.cli._console import new_table
from sloserve.cli._options import _WORKLOAD_FLAGS, ConfigOpt, ExecutorOpt, _with_flags
from sloserve.cli._progress import progress_bar, timed_bar
from sloserve.core.bounds import Count, Index, Percent, Seconds, Seed, Tokens, Workers
from sloserve.core.errors import ConfigError

_LIMIT_FLAGS = ("profile", "max_running", "max_batch_tokens", "chunk_size", "kv_capacity")
_REL_TOL = 1e-6
"""Replay agreement: the solver's integer time units round each coefficient (~1e-9 s)."""


def _cost_model(spec: str | None, profile: str) -> Any:
    from sloserve.costmodel.base import parse_cost_model
    from sloserve.costmodel.profile import load_profile

    if spec is None:
        return load_profile(profile).cost_model()
    return parse_cost_model(spec)


@app.command("optimal")
@_with_flags(*_WORKLOAD_FLAGS, *_LIMIT_FLAGS)
def optimal(
    config: ConfigOpt = None,
    requests: Annotated[
        int | None, bounded(Count, "--requests", help="N identical offline requests.")
    ] = None,
    input_tokens: Annotated[
        int | None, bounded(Tokens, "--input", help="I: prompt tokens of each request.")
    ] = None,
    output_tokens: Annotated[
        int | None, bounded(Tokens, "--output", help="O: output tokens of each request.")
    ] = None,
    cost_model: Annotated[
        str | None,
        typer.Option("--cost-model", help="constant:SECONDS instead of the profile's model."),
    ] = None,
    objective: Annotated[
        str, typer.Option("--objective", help="latency (total), ttft, tpot or makespan.")
    ] = "latency",
    time_limit: Annotated[
        float, bounded(Seconds, "--time-limit", help="Solver wall-clock limit, seconds.")
    ] = 10.0,
    det_limit: Annotated[
        float | None,
        bounded(
            Seconds,
            "--deterministic-limit",
            help="CP-SAT deterministic-time limit (load-independent; with --workers 1 the "
            "answer is reproducible).",
        ),
    ] = None,
    max_batches: Annotated[
        int | None,
        bounded(
            Count, "--max-batches", help="J, batches in the model (default: the warm start's)."
        ),
    ] = None,
    workers: Annotated[
        int | None, bounded(Workers, "--workers", help="CP-SAT workers (1: deterministic).")
    ] = None,
    solver_seed: Annotated[int, bounded(Seed, "--solver-seed", help="CP-SAT random seed.")] = 0,
    no_eviction: Annotated[bool, typer.Option("--no-eviction", help="Forbid evictions.")] = False,
    min_evictions: Annotated[
        int,
        bounded(Index, "--min-evictions", help="Require at least this many evictions."),
    ] = 0,
    no_hybrid: Annotated[
        bool, typer.Option("--no-hybrid", help="Forbid prefill and decode in one batch.")
    ] = False,
    no_chunked: Annotated[
        bool, typer.Option("--no-chunked-prefill", help="Every prefill completes in one batch.")
    ] = False,
    warm_start: Annotated[
        str | None,
        typer.Option(
            "--warm-start",
            help="Comma-separated policies to seed the solver with (the best is the hint), "
            "or 'none'. Default: vllm, vllm-ef, sarathi, sarathi-ef.",
        ),
    ] = None,
    better_than: Annotated[
        str | None,
        typer.Option("--better-than", help="Require a schedule better than this policy's."),
    ] = None,
    by_pct: Annotated[
        float, bounded(Percent, "--by", help="... by at least this many percent (--better-than).")
    ] = 0.0,
    schedule_out: Annotated[
        Path | None, typer.Option("--schedule-out", help="Write the schedule as JSON here.")
    ] = None,
    replay_file: Annotated[
        Path | None,
        typer.Option("--replay", help="Verify a schedule file through the engine instead."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON summary only.")] = False,
    *,
    flags: dict[str, Any],
) -> None:
    """Optimal schedule by constraint solving (InferMax §3.3), verified by engine replay."""
    if replay_file is not None:
        _replay(replay_file, flags.get("profile"), cost_model, as_json)
        return
    from sloserve.engine.interface import Limits
    from sloserve.optimal.infermax import (
        CspOptions,
        jobs_from_requests,
        replay,
        solve,
        uniform_jobs,
        write_schedule,
    )

    given = [requests, input_tokens, output_tokens]
    workload_flags = {k: v for k, v in flags.items() if k in _WORKLOAD_FLAGS and v is not None}
    if any(v is not None for v in given):
        if any(v is None for v in given):
            raise ConfigError("--requests, --input and --output go together")
        if workload_flags or config is not None:
            raise ConfigError("use either --requests/--input/--output or a workload, not both")
        assert requests is not None and input_tokens is not None and output_tokens is not None
        jobs = uniform_jobs(requests, input_tokens, output_tokens)
    elif workload_flags or config is not None:
        from sloserve.experiments.runner import workload_requests

        cfg, _ = _build_config({}, config, flags)
        jobs = jobs_from_requests(workload_requests(cfg))
        if not jobs:
            raise ConfigError("the workload has no requests")
    else:
        raise ConfigError(
            "give --requests N --input I --output O, or a workload slice "
            "(--workload/--trace ... --num-requests N)"
        )
    profile = flags.get("profile") or "llama-2-7b-a100"
    cm = _cost_model(cost_model, profile)
    c = flags.get("max_batch_tokens") or 4096
    p = min(flags.get("chunk_size") or c, c)
    m = flags.get("kv_capacity") or max(sum(j.max_kv for j in jobs), 1)
    try:
        limits = Limits(c, p, m, flags.get("max_running") or 256, 1)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    ws: tuple[str, ...] | None = None
    if warm_start is not None:
        ws = () if warm_start == "none" else tuple(s for s in warm_start.split(",") if s)
    opts = CspOptions(
        objective=objective,  # type: ignore[arg-type]  # validated by CspOptions
        max_batches=max_batches,
        allow_eviction=not no_eviction,
        allow_hybrid=not no_hybrid,
        allow_chunked_prefill=not no_chunked,
        time_limit_s=time_limit,
        deterministic_limit=det_limit,
        workers=workers,
        seed=solver_seed,
        warm_start=ws,
        better_than=better_than,
        better_by_pct=by_pct,
        min_evictions=min_evictions,
    )
    with timed_bar("solving (ETA: the time limit)", time_limit, as_json=as_json):
        result = solve(jobs, limits, cm, opts)
    out = result.summary()
    out["requests"] = len(jobs)
    out["limits"] = {"C": c, "P": p, "M": m, "R_max": limits.max_running}
    out["profile"] = profile if cost_model is None else cost_model
    if result.schedule is not None:
        run = replay(result.schedule, jobs, cm, limits)
        out["engine_latency"] = run.total_latency
        out["replay_matches"] = bool(
            run.all_finished
            and abs(run.total_latency - (result.latency or 0.0))
            <= _REL_TOL * max(run.total_latency, 1e-12)
        )
        if schedule_out is not None:
            sched = result.schedule
            meta = {
                **dict(sched.meta),
                "status": result.status,
                "objective_value": result.objective,
            }
            write_schedule(
                schedule_out,
                type(sched)(sched.batches, meta),
                jobs,
                limits,
                None if cost_model is not None else profile,
            )
    elif schedule_out is not None:
        raise ConfigError(f"no schedule to write: the solver says {result.status}")
    ran = {
        "workload": "uniform" if requests is not None else _workload_name(flags, config),
        "requests": len(jobs),
        "profile": out["profile"],
        "policy": "optimal (CP-SAT)",
        "objective": objective,
        "slo": None,
        "seed": solver_seed,
        "time_limit_s": time_limit,
    }
    if as_json:  # the summary's keys as they were, plus what ran
        sys.stdout.write(json.dumps({**out, "run": ran}, indent=2) + "\n")
        return
    console.print(
        f"workload {ran['workload']} ({len(jobs)} requests) | profile {ran['profile']} | "
        f"policy optimal, objective {objective} | SLO none | solver seed {solver_seed}, "
        f"time limit {time_limit:g} s",
        style="dim",
        highlight=False,
        soft_wrap=True,
    )
    _print(out, result)


def _workload_name(flags: dict[str, Any], config: Path | None) -> str:
    if flags.get("trace"):
        return str(flags["trace"])
    if flags.get("workload"):
        return str(flags["workload"])
    return str(config) if config is not None else "sharegpt"


def _print(out: dict[str, Any], result: Any) -> None:
    status = out["status"]
    # "optimal"/"infeasible" are proven only among schedules of at most J batches unless
    # J is at least batches_needed: say so rather than let it read as a global claim
    scope = ""
    if status in ("optimal", "infeasible") and out["batches_sufficient"] is not True:
        need = out["batches_needed"]
        scope = f" within J = {out['max_batches']} batches only (global needs J >= " + (
            f"{need})" if need is not None else "an unknown bound)"
        )
    console.print(
        f"[bold]{status}[/bold]{scope}  objective {out['objective']}  gap {out['gap']}  "
        f"({out['solve_seconds']:.2f} s, J = {out['max_batches']})"
    )
    if result.schedule is None:
        console.print(f"no schedule: the solver says {status}")
        return
    console.print(
        f"total latency {out['latency']:.6f} s (engine replay {out['engine_latency']:.6f} s, "
        f"{'matches' if out['replay_matches'] else 'DIFFERS'}), mean TTFT "
        f"{out['mean_ttft']:.6f} s, mean TPOT {out['mean_tpot']:.6f} s, makespan "
        f"{out['makespan']:.6f} s, {out['evictions']} evictions, {out['num_batches']} batches"
    )
    for name, lat in out["baselines"].items():
        console.print(f"  {name:<12} total latency {lat if lat is None else f'{lat:.6f} s'}")
    for k, b in enumerate(result.schedule.batches):
        run = " ".join(f"r{r}:{n}" for r, n in b.entries)
        ev = f"  evict {' '.join(f'r{r}' for r in b.evict)}" if b.evict else ""
        console.print(f"  batch {k:>3}: {run}{ev}")


def _replay(path: Path, profile: str | None, cost_model: str | None, as_json: bool) -> None:
    from sloserve.optimal.infermax import evaluate, read_schedule, replay

    sched, jobs, limits, file_profile = read_schedule(path)
    prof = profile or file_profile
    if prof is None and cost_model is None:
        raise ConfigError(f"{path} names no profile: pass --profile or --cost-model")
    cm = _cost_model(cost_model, prof or "llama-2-7b-a100")
    ev = evaluate(sched, jobs, cm, limits)
    run = replay(sched, jobs, cm, limits)
    objective = sched.meta.get("objective_value")
    name = sched.meta.get("objective")
    # the solver's objective (rounded integer costs) next to the same metric priced exactly
    priced = ev.metric(name) if name in ("latency", "ttft", "tpot", "makespan") else None
    out = {
        "schedule": str(path),
        "num_batches": sched.num_batches,
        "evictions": ev.evictions,
        "latency": ev.total_latency,
        "engine_latency": run.total_latency,
        "engine_preemptions": run.num_preemptions,
        "all_finished": run.all_finished,
        "objective": objective,
        "objective_name": name,
        "objective_priced": priced,
        "replay_matches": bool(
            run.all_finished
            and abs(run.total_latency - ev.total_latency) <= _REL_TOL * ev.total_latency
        ),
    }
    if as_json:
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    console.print(
        f"replayed {sched.num_batches} batches: engine total latency {run.total_latency:.6f} s, "
        f"schedule priced {ev.total_latency:.6f} s: "
        f"{'matches' if out['replay_matches'] else 'DIFFERS'}; solver objective {name} "
        f"{objective} (priced exactly: {priced})"
    )


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
    seed: Annotated[int, bounded(Seed, "--seed", help="Seed of the A.3 mixes and the CSP.")] = 0,
    workers: Annotated[
        int | None,
        bounded(
            Workers, "--workers", help="Parallel processes, and CP-SAT workers (default: cores)."
        ),
    ] = None,
    executor: ExecutorOpt = None,
    profile: Annotated[
        str, typer.Option("--profile", help="Replica profile (the paper: Llama-2-7B on A100).")
    ] = "llama-2-7b-a100",
    csp: Annotated[
        bool,
        typer.Option("--csp/--no-csp", help="Solve the §4.5 CSP (else only its presets run)."),
    ] = True,
    csp_time_limit: Annotated[
        float | None,
        bounded(
            Seconds, "--csp-time-limit", help="Seconds per CSP solve, two per I (quick 2, full 10)."
        ),
    ] = None,
) -> None:
    """InferMax §4 and A.3: high contention, eviction-free vs evicting, M sweep, the §4.5
    CSP experiment, R_max sweep and ranking by I vs O; data, plots and a table of our
    numbers beside the paper's findings."""
    from dataclasses import replace

    from sloserve.experiments.infermax import ANALYSES, Plan, reproduce

    analyses = tuple(a.strip() for a in only.split(",") if a.strip()) if only else ANALYSES
    base = Plan.quick if quick else Plan.full
    plan = base(seed, analyses)
    changes: dict[str, object] = {"profile": profile, "csp_solver": csp}
    if csp_time_limit is not None:
        if csp_time_limit <= 0:
            raise ConfigError(f"--csp-time-limit must be > 0, got {csp_time_limit}")
        changes["csp_time_limit_s"] = csp_time_limit
    plan = replace(plan, **changes)  # type: ignore[arg-type]
    from sloserve.experiments.executor import make_executor

    with make_executor(executor, workers) as ex, progress_bar("infermax") as bar:
        rep = reproduce(plan, out, workers=workers, progress=bar.stage, executor=ex)
    console.print(
        f"{'quick' if quick else 'full'} plan | analyses {', '.join(plan.analyses)} | profile "
        f"{plan.profile} | workloads: InferMax §4's fixed I/O grids and A.3 mixes | no SLO "
        f"(latency and throughput) | seed {plan.seed}",
        style="dim",
        highlight=False,
        soft_wrap=True,
    )
    t = new_table("§", "finding", "paper", "ours", title="InferMax: the paper's findings and ours")
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
