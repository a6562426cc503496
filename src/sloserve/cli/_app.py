"""The ``sloserve`` typer app, its shared options and the core commands.

Command families that grew their own modules (``optimal``, ``serve``, ``reproduce bros``,
``reproduce infermax``) live beside this file and register on ``app`` / ``reproduce_app``
when ``sloserve.cli`` is imported. Every error a user can cause ends as one line on stderr
and exit status 2 (``main``)."""

from __future__ import annotations

import functools
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from sloserve.config import (
    builtin_config,
    deep_merge,
    read_yaml,
    set_path,
    validate,
    validation_message,
)
from sloserve.core.errors import SloserveError

app = typer.Typer(
    name="sloserve",
    help="SLO-aware LLM serving: simulate and compare scheduling policies on calibrated replicas.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# Wide enough for the comparison table when output goes to a file or a CI log.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 400)

# ----------------------------------------------------------------------------- options
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="YAML file with any of the settings below (flags override it)."),
]
WorkloadOpt = Annotated[
    str | None, typer.Option("--workload", help="Named length mix: sharegpt, lmsys, be-synthetic.")
]
TraceOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace",
        help="A trace to replay (format: --trace-format; default sloserve's CSV with "
        "arrival_s,prompt_tokens,output_tokens and optional class,priority,model,"
        "ttft_slo_s,tpot_slo_s,deadline_s,qoe_ttft_s,qoe_tokens_per_s).",
    ),
]
TraceFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--trace-format", help="Trace format: sloserve, azure, burstgpt, sharegpt, table."
    ),
]
TraceUseOpt = Annotated[
    str | None,
    typer.Option("--trace-use", help="replay the trace, or draw (prompt, output) lengths from it."),
]
ColumnsOpt = Annotated[
    str | None,
    typer.Option(
        "--columns",
        help="Format 'table': name=column pairs, "
        "e.g. arrival_s=ts,prompt_tokens=in,output_tokens=out.",
    ),
]
StrictOpt = Annotated[
    bool | None,
    typer.Option(
        "--strict/--no-strict", help="Unsorted trace arrivals: error, or sort with a note."
    ),
]
KeepFailOpt = Annotated[
    bool | None,
    typer.Option(
        "--keep-failures", help="BurstGPT: keep 0-response rows (they are an error then)."
    ),
]
TokenizerOpt = Annotated[
    str | None,
    typer.Option("--tokenizer", help="ShareGPT: local tokenizer.json (default: 1.3 tokens/word)."),
]
SpeedupOpt = Annotated[
    float | None, typer.Option("--speedup", help="Replay the trace k times faster.")
]
WinStartOpt = Annotated[
    float | None, typer.Option("--window-start", help="Replay from this trace time (s).")
]
WinEndOpt = Annotated[
    float | None, typer.Option("--window-end", help="Replay until this trace time (s).")
]
SampleOpt = Annotated[
    float | None, typer.Option("--sample", help="Replay this fraction of the trace.")
]
MaxCtxOpt = Annotated[
    int | None, typer.Option("--max-context", help="Clip prompt+output to this many tokens.")
]
SloOpt = Annotated[str | None, typer.Option("--slo", help="SLO rules preset: bros, qlm, none.")]
ReadingOpt = Annotated[
    str | None,
    typer.Option("--reading-speed", help="QoE tokens/s: a number, 'reading' or 'listening'."),
]
ArrivalOpt = Annotated[
    str | None, typer.Option("--arrival", help="Arrival process: poisson, gamma, bursty, constant.")
]
RateOpt = Annotated[float | None, typer.Option("--rate", help="Mean arrival rate, requests/s.")]
CvOpt = Annotated[
    float | None, typer.Option("--cv", help="Gamma arrivals: coefficient of variation of gaps.")
]
BurstIOpt = Annotated[
    float | None, typer.Option("--burst-intensity", help="Bursty arrivals: burst rate / mean rate.")
]
BurstFOpt = Annotated[
    float | None,
    typer.Option("--burst-fraction", help="Bursty arrivals: fraction of each period in burst."),
]
BurstPOpt = Annotated[
    float | None, typer.Option("--burst-period", help="Bursty arrivals: period in seconds.")
]
DurationOpt = Annotated[float | None, typer.Option("--duration", help="Arrival window in seconds.")]
NumReqOpt = Annotated[
    int | None, typer.Option("--num-requests", help="Cap on the number of requests.")
]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Random seed of the workload.")]
ProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", help="Replica profile (see `sloserve profiles`) or a profile YAML."),
]
MaxRunOpt = Annotated[
    int | None, typer.Option("--max-running", help="R_max: requests holding KV at once.")
]
MaxTokOpt = Annotated[
    int | None, typer.Option("--max-batch-tokens", help="C: tokens per iteration.")
]
ChunkOpt = Annotated[
    int | None,
    typer.Option("--chunk-size", help="P: prefill tokens per iteration (default: the policy's)."),
]
BlockOpt = Annotated[
    int | None, typer.Option("--block-size", help="KV block size in tokens (1 = token-exact M).")
]
KvUtilOpt = Annotated[
    float | None, typer.Option("--kv-utilization", help="GPU memory fraction vLLM may use (0.9).")
]
KvCapOpt = Annotated[int | None, typer.Option("--kv-capacity", help="Override M, in tokens.")]
PredOpt = Annotated[
    str | None,
    typer.Option(
        "--predictor", help="Output-length predictor: oracle, constant:N, max-tokens[:N]."
    ),
]
CostOpt = Annotated[
    str | None,
    typer.Option("--cost-model", help="constant:SECONDS instead of the profile's model."),
]
HorizonOpt = Annotated[
    float | None, typer.Option("--horizon", help="Abort requests still live at this time (s).")
]
OutOpt = Annotated[
    Path | None, typer.Option("--out", help="Write a report folder (parquet, summary.json, plots).")
]

_DEFAULT_RATE = 4.0  # WorkloadSpec's default arrival rate, requests/s

_FLAG_PATHS: dict[str, tuple[str, ...]] = {
    "workload": ("workload", "mix"),
    "trace": ("workload", "trace"),
    "arrival": ("workload", "arrival", "kind"),
    "rate": ("workload", "arrival", "rate"),
    "cv": ("workload", "arrival", "cv"),
    "burst_intensity": ("workload", "arrival", "intensity"),
    "burst_fraction": ("workload", "arrival", "burst_fraction"),
    "burst_period": ("workload", "arrival", "period_s"),
    "duration": ("workload", "duration_s"),
    "num_requests": ("workload", "num_requests"),
    "seed": ("workload", "seed"),
    "profile": ("instance", "profile"),
    "max_running": ("instance", "max_running"),
    "max_batch_tokens": ("instance", "max_batch_tokens"),
    "chunk_size": ("instance", "chunk_size"),
    "block_size": ("instance", "block_size"),
    "kv_utilization": ("instance", "kv_utilization"),
    "kv_capacity": ("instance", "kv_capacity_tokens"),
    "predictor": ("instance", "predictor"),
    "cost_model": ("instance", "cost_model"),
    "horizon": ("horizon_s",),
    "trace_format": ("workload", "trace_format"),
    "trace_use": ("workload", "trace_use"),
    "columns": ("workload", "trace_columns"),
    "strict": ("workload", "strict"),
    "keep_failures": ("workload", "drop_failures"),
    "tokenizer": ("workload", "tokenizer"),
    "speedup": ("workload", "replay", "speedup"),
    "window_start": ("workload", "replay", "start_s"),
    "window_end": ("workload", "replay", "end_s"),
    "sample": ("workload", "replay", "sample"),
    "max_context": ("workload", "max_context"),
    "slo": ("workload", "slo"),
    "reading_speed": ("workload", "qoe", "tokens_per_s"),
}


# Options shared by several commands: declared once, added to each command's signature by
# :func:`_with_flags` (typer reads the signature), and handed over as one ``flags`` dict.
_FLAG_OPTIONS: dict[str, Any] = {
    "workload": WorkloadOpt,
    "trace": TraceOpt,
    "trace_format": TraceFormatOpt,
    "trace_use": TraceUseOpt,
    "columns": ColumnsOpt,
    "strict": StrictOpt,
    "keep_failures": KeepFailOpt,
    "tokenizer": TokenizerOpt,
    "speedup": SpeedupOpt,
    "window_start": WinStartOpt,
    "window_end": WinEndOpt,
    "sample": SampleOpt,
    "max_context": MaxCtxOpt,
    "slo": SloOpt,
    "reading_speed": ReadingOpt,
    "arrival": ArrivalOpt,
    "rate": RateOpt,
    "cv": CvOpt,
    "burst_intensity": BurstIOpt,
    "burst_fraction": BurstFOpt,
    "burst_period": BurstPOpt,
    "duration": DurationOpt,
    "num_requests": NumReqOpt,
    "seed": SeedOpt,
    "profile": ProfileOpt,
    "max_running": MaxRunOpt,
    "max_batch_tokens": MaxTokOpt,
    "chunk_size": ChunkOpt,
    "block_size": BlockOpt,
    "kv_utilization": KvUtilOpt,
    "kv_capacity": KvCapOpt,
    "predictor": PredOpt,
    "cost_model": CostOpt,
    "horizon": HorizonOpt,
}
_WORKLOAD_FLAGS = (
    "workload",
    "trace",
    "trace_format",
    "trace_use",
    "columns",
    "strict",
    "keep_failures",
    "tokenizer",
    "speedup",
    "window_start",
    "window_end",
    "sample",
    "max_context",
    "slo",
    "reading_speed",
    "arrival",
    "rate",
    "cv",
    "burst_intensity",
    "burst_fraction",
    "burst_period",
    "duration",
    "num_requests",
    "seed",
)
_INSTANCE_FLAGS = (
    "profile",
    "max_running",
    "max_batch_tokens",
    "chunk_size",
    "block_size",
    "kv_utilization",
    "kv_capacity",
    "predictor",
    "cost_model",
    "horizon",
)


def _with_flags(*names: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the shared options ``names``; it receives them as ``flags=``."""

    def deco(fn: Callable[..., None]) -> Callable[..., None]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "flags"]
        extra = [
            inspect.Parameter(
                n, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=_FLAG_OPTIONS[n]
            )
            for n in names
        ]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> None:
            fn(flags={n: kwargs.pop(n) for n in names}, **kwargs)

        command.__signature__ = sig.replace(parameters=own + extra)  # type: ignore[attr-defined]
        return command

    return deco


def _speed(v: str) -> float | str:
    try:
        return float(v)
    except ValueError:
        return v


# Flags whose value needs converting before it goes into the config.
_CONVERT: dict[str, Any] = {
    "columns": lambda v: _parse_columns(v),
    "keep_failures": lambda v: not v,
    "reading_speed": _speed,
}


def _parse_columns(v: str) -> dict[str, str]:
    from sloserve.workloads.loaders import parse_columns

    return parse_columns(v)


def _build_config(
    base: dict[str, Any], config: Path | None, flags: dict[str, Any]
) -> tuple[Any, list[str] | None]:
    """Merge built-in defaults, a YAML file and flags into a SimConfig (+ a policy list)."""
    from sloserve.experiments.runner import SimConfig

    data = dict(base)
    source = "built-in defaults"
    if config is not None:
        data = deep_merge(data, read_yaml(config))
        source = str(config)
    policies = data.pop("policies", None)
    workload = data.get("workload")
    kind = flags.get("arrival")
    if (
        kind is not None
        and isinstance(workload, dict)
        and isinstance(workload.get("arrival"), dict)
    ):
        old = workload["arrival"]
        if old.get("kind", "poisson") != kind:
            # Another process: keep only the mean rate; the old one's shape keys don't apply.
            workload["arrival"] = {"rate": old["rate"]} if "rate" in old else {}
    for name, value in flags.items():
        if value is None:
            continue
        if name in _FLAG_PATHS:
            if name in _CONVERT:
                value = _CONVERT[name](value)
            set_path(data, _FLAG_PATHS[name], str(value) if isinstance(value, Path) else value)
            if name == "max_context":  # traces are capped by the replay options
                set_path(data, ("workload", "replay", "max_context"), value)
            source = f"{source} + command line" if "command line" not in source else source
    arrival = (
        data.get("workload", {}).get("arrival") if isinstance(data.get("workload"), dict) else None
    )
    if isinstance(arrival, dict):
        arrival.setdefault("kind", "poisson")
        arrival.setdefault("rate", _DEFAULT_RATE)
    if policies is not None and (
        not isinstance(policies, list) or not all(isinstance(p, str) for p in policies)
    ):
        raise SloserveError(f"{source}: 'policies' must be a list of policy names")
    return validate(SimConfig, data, source), policies


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


# ----------------------------------------------------------------------------- commands
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
        float | None, typer.Option("--bin", help="Rate-over-time bin width (s).")
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
    t = Table(title=f"{stats['requests']} requests over {stats['span_s']:.1f} s", show_header=True)
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
    out: Annotated[Path, typer.Option("--out", help="CSV file to write (sloserve trace format).")],
    config: ConfigOpt = None,
    *,
    flags: dict[str, Any],
) -> None:
    """Write a workload as a trace CSV, to replay it exactly later (--trace FILE)."""
    from sloserve.workloads.describe import export_trace

    wl = _workload_from_flags(config, flags)
    export_trace(wl.requests, out)
    console.print(f"{len(wl.requests)} requests written to {out}")
    if wl.batch_jobs is not None:
        console.print(
            "[yellow]closed-loop batch jobs depend on the server and are not in the file[/yellow]"
        )


costmodel_app = typer.Typer(
    help="Cost models: show a profile, fit measured iterations.", no_args_is_help=True
)
app.add_typer(costmodel_app, name="costmodel")


@costmodel_app.command("show")
def costmodel_show(
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="Built-in profile, MODEL@GPU[xTP], or a profile YAML."),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Catalog model, e.g. llama-2-7b.")
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Catalog GPU, e.g. a100-80gb.")] = None,
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel degree.")] = 1,
    utilization: Annotated[
        float, typer.Option("--utilization", help="GPU memory fraction for vLLM.")
    ] = 0.9,
    tpot_ms: Annotated[
        float, typer.Option("--tpot-ms", help="TPOT target for the max batch size.")
    ] = 50.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the data as JSON.")] = False,
) -> None:
    """Show M (KV tokens), prefill tokens/s, decode step time vs batch and context, and the
    largest batch meeting a TPOT target."""
    from sloserve.costmodel.show import show

    if profile is None and (model is None or gpu is None):
        raise SloserveError("give --profile NAME, or --model and --gpu (and --tp)")
    d = show(profile, model=model, gpu=gpu, tp=tp, utilization=utilization, tpot_s=tpot_ms / 1e3)
    if as_json:
        sys.stdout.write(json.dumps(d, indent=2) + "\n")
        return
    console.print(
        f"{d['profile']} ({d['kind']}): {d['model']} on {d['tp']}x {d['gpu']}; "
        f"M = {d['kv']['capacity_tokens']:,} tokens at utilization {d['kv']['utilization']}"
    )
    for p in d["prefill"]:
        console.print(
            f"prefill {p['tokens']} tokens: {p['seconds'] * 1e3:.1f} ms "
            f"({p['tokens_per_s']:,.0f} tokens/s)"
        )
    t = Table("decode step (ms)", *(f"ctx {c}" for c in d["decode"]["contexts"]))
    for b, row, fits in zip(
        d["decode"]["batch_sizes"], d["decode"]["step_ms"], d["decode"]["fits_kv"], strict=True
    ):
        t.add_row(
            f"batch {b}",
            *(f"{v:.1f}" + ("" if ok else " (>M)") for v, ok in zip(row, fits, strict=True)),
        )
    console.print(t)
    t2 = Table(
        f"context (TPOT {d['max_batch_for_tpot']['tpot_ms']:g} ms)", "max batch", "limited by"
    )
    for r in d["max_batch_for_tpot"]["per_context"]:
        t2.add_row(str(r["context"]), str(r["max_batch"]), r["limited_by"])
    console.print(t2)


@costmodel_app.command("fit")
def costmodel_fit(
    csv: Annotated[Path, typer.Argument(help="Measured iterations (the `sloserve profile` CSV).")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Write a profile YAML (use with --profile).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Profile name.")] = None,
    base_profile: Annotated[
        str | None,
        typer.Option("--base-profile", help="Take model/GPU facts (M) from this profile."),
    ] = None,
    tp: Annotated[int | None, typer.Option("--tp", min=1, help="Tensor-parallel degree.")] = None,
    description: Annotated[str, typer.Option("--description", help="Free text.")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print the fit report as JSON.")] = False,
) -> None:
    """Fit the InferMax/Vidur linear model to measured iterations; report R² and errors."""
    from sloserve.costmodel.fit import (
        fit_profile_csv,
        format_fit_report,
        profile_from_csv,
        write_profile_yaml,
    )
    from sloserve.experiments.report import jsonable

    if out is None:
        coeffs, report = fit_profile_csv(csv)
        if as_json:
            payload = {"coefficients": coeffs.model_dump(), "report": report}
            sys.stdout.write(json.dumps(jsonable(payload), indent=2) + "\n")
            return
        console.print(format_fit_report(report), highlight=False)
        console.print(coeffs.model_dump(), highlight=False)
        return
    prof = profile_from_csv(
        csv, name=name, tp=tp, base_profile=base_profile, description=description
    )
    write_profile_yaml(prof, out)
    if as_json:
        sys.stdout.write(json.dumps(jsonable(prof.fit_report), indent=2) + "\n")
        return
    console.print(format_fit_report(prof.fit_report), highlight=False)
    console.print(f"profile written to {out}; use it with --profile {out}")


def _int_list(value: str | None, flag: str) -> list[int] | None:
    if value is None:
        return None
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise SloserveError(f"{flag}: expected comma-separated integers, got {value!r}") from None
    if not out or any(v < 0 for v in out):
        raise SloserveError(f"{flag}: expected non-negative integers, got {value!r}")
    return out


@app.command("profile")
def profile_cmd(
    model: Annotated[
        str,
        typer.Argument(
            help="'tiny' (a small random Llama), a catalog or profile model (random weights "
            "built from its config), or a local Hugging Face model directory."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="CSV of measured iterations.")],
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    prefill_chunks: Annotated[
        str | None, typer.Option("--prefill-chunks", help="e.g. 16,64,256.")
    ] = None,
    decode_batches: Annotated[
        str | None, typer.Option("--decode-batches", help="e.g. 1,4,16.")
    ] = None,
    contexts: Annotated[str | None, typer.Option("--contexts", help="e.g. 0,128,512.")] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=1)] = 5,
    warmup: Annotated[int, typer.Option("--warmup", min=0)] = 2,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="float32, float16 or bfloat16.")
    ] = None,
    cpu_threads: Annotated[int | None, typer.Option("--cpu-threads", min=1)] = None,
    fit_out: Annotated[
        Path | None, typer.Option("--fit", help="Also fit it and write a profile YAML here.")
    ] = None,
) -> None:
    """Measure a real PyTorch causal LM (prefill chunks and decode batches across sizes and
    contexts), write the measurements as CSV, and optionally fit a profile from them."""
    from sloserve.costmodel.profiler import profile_model, tiny_llama_spec, write_profile_csv

    target: Any
    if model == "tiny":
        target = tiny_llama_spec()
    elif Path(model).is_dir():
        target = Path(model)
    else:
        try:
            from sloserve.costmodel.catalog import model_spec

            target = model_spec(model)
        except SloserveError:
            from sloserve.costmodel.profile import load_profile

            target = load_profile(model).model
    kwargs: dict[str, Any] = {
        "device": device,
        "repeats": repeats,
        "warmup": warmup,
        "dtype": dtype,
        "cpu_threads": cpu_threads,
    }
    for key, raw, flag in (
        ("prefill_chunks", prefill_chunks, "--prefill-chunks"),
        ("decode_batches", decode_batches, "--decode-batches"),
        ("contexts", contexts, "--contexts"),
    ):
        parsed = _int_list(raw, flag)
        if parsed is not None:
            kwargs[key] = parsed
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SloserveError(
            "sloserve profile needs PyTorch: pip install 'sloserve[profile]' (on a CPU-only "
            "machine, pip install torch==2.13.0 first)"
        ) from None
    with console.status("profiling…"):
        df = profile_model(target, **kwargs)
    write_profile_csv(df, out)
    console.print(f"{len(df)} measured iterations written to {out}")
    if fit_out is not None:
        from sloserve.costmodel.fit import format_fit_report, profile_from_csv, write_profile_yaml

        prof = profile_from_csv(out)
        write_profile_yaml(prof, fit_out)
        console.print(format_fit_report(prof.fit_report), highlight=False)
        console.print(f"profile written to {fit_out}")


reproduce_app = typer.Typer(
    help="Reproduce the papers' evaluations in simulation.", no_args_is_help=True
)
app.add_typer(reproduce_app, name="reproduce")


@app.command("policies")
def list_policies() -> None:
    """List the scheduling policies."""
    from sloserve.policies.registry import policy_summaries

    t = Table("policy", "what it is")
    t.columns[0].no_wrap = True
    for name, summary in policy_summaries().items():
        t.add_row(name, summary)
    console.print(t)


@app.command("profiles")
def list_profiles() -> None:
    """List the built-in replica profiles with their KV capacity at 0.9 utilisation."""
    from sloserve.costmodel.profile import load_profile, profile_names

    t = Table("profile", "model", "GPU", "TP", "M (tokens)", "decode 1 / 32 req (ms)")
    t.columns[0].no_wrap = True
    for col in t.columns[1:]:
        col.overflow = "fold"
    for name in profile_names():
        p = load_profile(name)
        cm = p.cost_model()
        t.add_row(
            name,
            p.model.name,
            p.gpu.name,
            str(p.tp),
            f"{p.kv_capacity_tokens(0.9):,}",
            f"{cm.decode_time(1, 1024) * 1e3:.1f} / {cm.decode_time(32, 32 * 1024) * 1e3:.1f}",
        )
    console.print(t)


def main() -> None:
    """Console-script entry point: user errors become one line and exit status 2."""
    try:
        app()
    except SloserveError as e:
        err_console.print(f"sloserve: error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except ValidationError as e:
        err_console.print(
            f"sloserve: error: {validation_message(e, 'input')}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(2)

