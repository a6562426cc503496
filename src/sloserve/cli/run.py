"""CLI commands: simulate, compare and demo (registered on import by ``sloserve.cli``).

``simulate`` runs one policy on one replica, ``compare`` several policies on the very same
requests, ``demo`` the built-in policies on the built-in bursty chat workload; each prints
a summary table (or ``--json``) and optionally writes a report folder (``--out``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sloserve.cli._app import _build_config, app, console
from sloserve.cli._cluster import ReplicasOpt, RouterOpt, TraceDecisionsOpt, _cluster_config
from sloserve.cli._options import (
    _INSTANCE_FLAGS,
    _WORKLOAD_FLAGS,
    ConfigOpt,
    DurationOpt,
    OutOpt,
    RateOpt,
    SeedOpt,
    _with_flags,
)
from sloserve.cli._progress import Bar, progress_bar
from sloserve.cli.execute import (
    DeviceOpt,
    DtypeOpt,
    ModelPathOpt,
    ModelSpecOpt,
    check_executor,
    load,
    print_timing,
)
from sloserve.config import builtin_config
from sloserve.core.errors import SloserveError, did_you_mean

if TYPE_CHECKING:
    from rich.table import Table


def _summary_table(results: dict[str, Any], title: str, label: str = "policy") -> Table:
    from rich.table import Table  # here: a --json run prints no table (start-up time)

    from sloserve.experiments.report import SUMMARY_COLUMNS, summary_rows

    table = Table(title=title, show_lines=False)
    # Narrow terminals: numbers and headers fold onto more lines, names never get cut.
    table.add_column(label, style="bold", no_wrap=True)
    for _k, header, _f in SUMMARY_COLUMNS:
        table.add_column(header, justify="right", overflow="fold")
    for row in summary_rows(results):
        table.add_row(*row)
    return table


ResultFormatOpt = Annotated[
    str,
    typer.Option(
        "--result-format",
        metavar="sloserve|vllm",
        help="--json output (and --out's result file): sloserve's summary, or the JSON "
        "`vllm bench serve --save-result` writes (one object per line for several runs).",
    ),
]
ChromeTraceOpt = Annotated[
    Path | None,
    typer.Option(
        "--chrome-trace",
        metavar="FILE.json",
        help="Write a Perfetto / chrome://tracing trace (several runs: one file each, "
        "the run's name before the suffix).",
    ),
]


def _extra_outputs(
    results: dict[str, Any], result_format: str, chrome: Path | None, out: Path | None
) -> str | None:
    """--chrome-trace files, and the vLLM result text when --result-format vllm."""
    if result_format not in ("sloserve", "vllm"):
        raise SloserveError(
            f"--result-format: unknown {result_format!r}"
            f"{did_you_mean(result_format, ('sloserve', 'vllm'))}; valid: sloserve, vllm"
        )
    if chrome is not None:
        from sloserve.experiments.chrome_trace import write_chrome_traces

        write_chrome_traces(results, chrome)
    if result_format != "vllm":
        return None
    from sloserve.experiments.vllm_result import vllm_results_text

    text = vllm_results_text(results)
    if out is not None:
        (out / "vllm_result.json").write_text(text)
    return text


@app.command()
@_with_flags(*_WORKLOAD_FLAGS, *_INSTANCE_FLAGS)
def simulate(
    config: ConfigOpt = None,
    policy: Annotated[
        str | None, typer.Option("--policy", help="Scheduling policy (see `sloserve policies`).")
    ] = None,
    out: OutOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON summary only.")] = False,
    replicas: ReplicasOpt = None,
    router: RouterOpt = None,
    result_format: ResultFormatOpt = "sloserve",
    chrome_trace: ChromeTraceOpt = None,
    trace_decisions: TraceDecisionsOpt = False,
    executor: Annotated[
        str,
        typer.Option(
            "--executor",
            metavar="cost-model|torch",
            help="What runs each iteration: the profile's cost model, or a real PyTorch "
            "model (execute mode: --model-spec or --model, --device).",
        ),
    ] = "cost-model",
    model_spec: ModelSpecOpt = None,
    model: ModelPathOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    *,
    flags: dict[str, Any],
) -> None:
    """Simulate one policy on one replica (or a cluster: --replicas, --router, or a YAML
    'cluster:' section) and print its summary. With --executor torch every iteration is a
    real forward pass and the summary adds measured vs predicted iteration times."""
    from sloserve.experiments.report import jsonable, run_caption, run_info, write_report
    from sloserve.experiments.runner import simulate as run_one

    cfg, listed = _build_config({}, config, flags)
    cluster, _routers = _cluster_config(
        config, replicas, router, single=True, trace_decisions=trace_decisions
    )
    if policy is not None:
        cfg = cfg.model_copy(update={"policy": policy})
    elif listed is not None:
        raise SloserveError(
            f"{config}: 'policies' lists several policies; use `sloserve compare`, "
            "or pick one with --policy"
        )
    from sloserve.policies.registry import make_policy

    make_policy(cfg.policy, cfg.policy_params)
    execute = check_executor(executor)
    if execute and cluster is not None:
        raise SloserveError("--executor torch runs one replica (no --replicas / cluster)")
    if execute:
        from sloserve.experiments.execute_run import simulate_execute

        result, _ex = simulate_execute(cfg, load(model_spec, model, device, dtype))
    elif model_spec is not None or model is not None:
        raise SloserveError("--model-spec / --model need --executor torch")
    elif cluster is None:
        result = run_one(cfg)
    else:
        from sloserve.experiments.cluster_run import simulate_cluster

        result = simulate_cluster(cfg, cluster)
    # A cluster of mixed policies is named by all of them (the summary's "a+b").
    name = str(result.summary.get("policy") or cfg.policy)
    if out is not None:
        write_report({name: result}, out)
    vllm_text = _extra_outputs({name: result}, result_format, chrome_trace, out)
    if vllm_text is not None:  # the vLLM JSON replaces the table (as --json would)
        sys.stdout.write(vllm_text)
        return
    info = run_info(cfg)
    if as_json:  # the summary's keys as they were, plus what ran
        sys.stdout.write(json.dumps(jsonable({**result.summary, "run": info}), indent=2) + "\n")
        return
    console.print(run_caption(info), style="dim", highlight=False, soft_wrap=True)
    console.print(
        _summary_table(
            {name: result},
            f"{len(result.requests)} requests, "
            f"{result.summary['simulated_seconds']:.0f} s simulated",
        )
    )
    if cluster is not None:
        console.print(_replica_table(result.summary))
    if execute:
        print_timing(result.summary)
    _note_rejections({name: result})
    if out is not None:
        console.print(f"report written to {out}")


def _replica_table(summary: dict[str, Any]) -> Table:
    """One row per replica of a cluster run: what it served and how busy it was (with
    prefill/decode roles: each replica's role and the requests it handed off)."""
    from rich.table import Table

    pd = any(r.get("role", "both") != "both" for r in summary["replicas"])
    cost = summary.get("cost_usd")
    title = (
        f"{len(summary['replicas'])} replicas, router {summary.get('router')}, "
        f"{summary['gpu_seconds']:,.0f} GPU-s" + (f", ${cost:,.2f}" if cost is not None else "")
    )
    if pd:
        mean = summary.get("kv_transfer_s_mean")
        ms = f"{1e3 * mean:.2f} ms" if mean is not None else "-"
        title += f", {summary.get('kv_transfers', 0)} KV transfers (mean {ms})"
    t = Table(title=title)
    for col in ("replica", "profile", "policy", "model", *(("role",) if pd else ())):
        t.add_column(col, no_wrap=col == "replica")
    for col in (
        *(("handed off",) if pd else ()),
        "served",
        "busy",
        "KV mean",
        "preempt",
        "GPUs",
        "GPU-s",
    ):
        t.add_column(col, justify="right")
    for r in summary["replicas"]:
        t.add_row(
            str(r["replica"]),
            str(r["profile"]),
            str(r["policy"]),
            str(r["model"]),
            *((str(r["role"]), str(r["handed_off"])) if pd else ()),
            str(r["served"]),
            f"{r['utilisation']:.0%}" if r.get("utilisation") is not None else "-",
            f"{r['kv_usage_mean']:.0%}" if r.get("kv_usage_mean") is not None else "-",
            str(r["preemptions"]),
            str(r["gpus"]),
            f"{r['gpu_seconds']:.0f}",
        )
    return t


def _split(value: str | None) -> list[str] | None:
    return [p.strip() for p in value.split(",") if p.strip()] if value else None


def _compare(
    base: dict[str, Any],
    config: Path | None,
    flags: dict[str, Any],
    policies: str | None,
    out: Path | None,
    as_json: bool,
    replicas: int | None = None,
    router: str | None = None,
    routers: str | None = None,
    result_format: str = "sloserve",
    chrome_trace: Path | None = None,
    trace_decisions: bool = False,
) -> None:
    from sloserve.experiments.report import jsonable, run_caption, run_info, write_report

    cfg, listed = _build_config(base, config, flags)
    cluster, yaml_routers = _cluster_config(
        config, replicas, router, trace_decisions=trace_decisions
    )
    router_list = _split(routers) or (None if router is not None else yaml_routers)
    names = _split(policies) or listed
    label = "policy"
    if router_list is None:
        if not names:
            raise SloserveError(
                "no policies given: use --policies a,b or 'policies:' in the config"
            )
        with progress_bar("simulating", as_json=as_json) as bar:
            if cluster is None:
                results = _compare_single(cfg, names, bar)
            else:
                results = _compare_cluster(cfg, cluster, names, [cluster.router], bar)
    else:
        assert cluster is not None  # a router list makes a cluster
        names = names or [cfg.policy]
        label = "router" if len(names) == 1 else "policy / router"
        with progress_bar("simulating", as_json=as_json) as bar:
            results = _compare_cluster(cfg, cluster, names, router_list, bar)
    if out is not None:
        write_report(results, out)
    vllm_text = _extra_outputs(results, result_format, chrome_trace, out)
    if vllm_text is not None:  # the vLLM JSON replaces the table (as --json would)
        sys.stdout.write(vllm_text)
        return
    info = run_info(cfg, names)
    if router_list is not None:
        info["router"] = router_list
    if as_json:  # policy -> summary as it was, plus what ran under "run"
        summaries: dict[str, Any] = {n: r.summary for n, r in results.items()}
        sys.stdout.write(json.dumps(jsonable({**summaries, "run": info}), indent=2) + "\n")
        return
    console.print(run_caption(info), style="dim", highlight=False, soft_wrap=True)
    first = next(iter(results.values()))
    console.print(
        _summary_table(
            results,
            f"{len(first.requests)} requests, same arrivals for every "
            + ("run" if "/" in label else label),
            label,
        )
    )
    _note_rejections(results)
    if out is not None:
        console.print(f"report written to {out}")


def _compare_single(cfg: Any, policies: list[str], bar: Bar) -> dict[str, Any]:
    """Each policy on the very same requests (``runner.compare``, one bar step a run)."""
    from sloserve.experiments.runner import check_policies, simulate, workload_of

    check_policies(cfg, policies)
    workload = workload_of(cfg)
    results: dict[str, Any] = {}
    for k, p in enumerate(policies):
        bar(k, len(policies))
        results[p] = simulate(cfg.model_copy(update={"policy": p}), workload)
    bar(len(policies), len(policies))
    return results


def _compare_cluster(
    cfg: Any, cluster: Any, policies: list[str], routers: list[str], bar: Bar | None = None
) -> dict[str, Any]:
    """Every (policy, router) on the very same requests; keys name what varies."""
    from sloserve.cluster.routing import check_router
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.runner import check_policies, workload_of

    check_policies(cfg, policies)  # fail before running anything
    dup = sorted({r for r in routers if routers.count(r) > 1})
    if dup:
        raise SloserveError(f"router listed twice: {', '.join(dup)}")
    for r in routers:
        check_router(r, cluster.router_params if r == cluster.router else None)
    workload = workload_of(cfg)
    results: dict[str, Any] = {}
    total = len(policies) * len(routers)
    for p in policies:
        for r in routers:
            if bar is not None:
                bar(len(results), total)
            key = p if len(routers) == 1 else r if len(policies) == 1 else f"{p} / {r}"
            params = cluster.router_params if r == cluster.router else {}
            ccfg = cluster.model_copy(update={"router": r, "router_params": params})
            results[key] = simulate_cluster(cfg.model_copy(update={"policy": p}), ccfg, workload)
    return results


def _note_rejections(results: dict[str, Any]) -> None:
    """Say when requests were turned away, and why: a silent drop would mislead."""
    for name, r in results.items():
        rejected = r.table[r.table["status"] == "rejected"]
        if len(rejected):
            why = rejected["reject_reason"].iloc[0]
            console.print(
                f"[yellow]{name}: {len(rejected)} request(s) rejected, e.g. {why}[/yellow]"
            )


@app.command()
@_with_flags(*_WORKLOAD_FLAGS, *_INSTANCE_FLAGS)
def compare(
    config: ConfigOpt = None,
    policies: Annotated[
        str | None, typer.Option("--policies", help="Comma-separated policies to compare.")
    ] = None,
    out: OutOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON summaries only.")] = False,
    replicas: ReplicasOpt = None,
    router: RouterOpt = None,
    routers: Annotated[
        str | None,
        typer.Option(
            "--routers",
            help="Comma-separated cluster routers to compare (each with every policy).",
        ),
    ] = None,
    result_format: ResultFormatOpt = "sloserve",
    chrome_trace: ChromeTraceOpt = None,
    trace_decisions: TraceDecisionsOpt = False,
    *,
    flags: dict[str, Any],
) -> None:
    """Compare policies (or cluster routers) on the very same requests; print a table,
    optionally write a report."""
    _compare(
        {},
        config,
        flags,
        policies,
        out,
        as_json,
        replicas,
        router,
        routers,
        result_format,
        chrome_trace,
        trace_decisions,
    )


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
