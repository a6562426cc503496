"""``sloserve aladdin fit|config`` and ``sloserve reproduce aladdin`` (registered on import
by ``sloserve.cli``). Paper: ``/work/shared/papers/aladdin.txt``; the code:
:mod:`sloserve.cluster.aladdin`, the harness: :mod:`sloserve.experiments.aladdin`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sloserve.cli._app import app, console, reproduce_app
from sloserve.cli._bounded import bounded
from sloserve.cli._console import new_table
from sloserve.core.bounds import Fraction, Millis
from sloserve.core.errors import ConfigError

if TYPE_CHECKING:
    from sloserve.experiments.aladdin import Reproduction

aladdin_app = typer.Typer(
    help="Aladdin: performance models, worker configuration.", no_args_is_help=True
)
app.add_typer(aladdin_app, name="aladdin")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the data as JSON.")]


@aladdin_app.command("fit")
def aladdin_fit(
    profile: Annotated[
        str,
        typer.Option("--profile", help="Built-in profile, MODEL@GPU[xTP], or a profile YAML."),
    ] = "llama-2-70b-a100x2",
    samples: Annotated[
        Path | None,
        typer.Option("--samples", help="Measured samples CSV (kind,batch_size,tokens,value)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fit Aladdin's §3 models (KV, prefill, decode) by least squares and show each fit's
    error (paper: prefill < 4 %, decode < 5 %, KV < 1 %)."""
    from sloserve.cluster.aladdin.perf_models import fit_profile

    m = fit_profile(profile, samples_csv=samples)
    if as_json:
        sys.stdout.write(json.dumps(m.report(), indent=2) + "\n")
        return
    console.print(m.source, style="dim", highlight=False)
    t = new_table("model", "fit", "max error", "mean error", title="Aladdin §3 performance models")
    t.add_row(
        "KV (Eq. 1)",
        f"kv = {m.h:.4g}·(l_in+l_out) + {m.j:.4g} GiB",
        f"{m.max_error['kv']:.1%}",
        f"{m.mean_error['kv']:.1%}",
    )
    t.add_row(
        "prefill (Eq. 2)",
        f"t = max({m.k1 * 1e6:.4g} µs·Σl_in + {m.c1 * 1e3:.4g} ms, {m.c0 * 1e3:.4g} ms)"
        f" (line above {m.knee:g}·floor)",
        f"{m.max_error['prefill']:.1%}",
        f"{m.mean_error['prefill']:.1%}",
    )
    t.add_row(
        "decode (Eq. 3)",
        f"t = ({m.k2 * 1e6:.4g} µs·l_ave + {m.c2 * 1e3:.4g} ms)·b + {m.c3 * 1e3:.4g} ms",
        f"{m.max_error['decode']:.1%}",
        f"{m.mean_error['decode']:.1%}",
    )
    console.print(t)


def _degrees(v: str) -> list[int]:
    try:
        out = [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"tp: {v!r} is not a comma-separated list of integers") from None
    if not out:
        raise ConfigError(f"tp: {v!r} names no degree")
    return out


def _rates(v: str) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in v.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"rates: {v!r} is not a comma-separated list of numbers") from None
    if not out or not all(0 < r <= 10_000 for r in out):
        raise ConfigError(f"rates: {v!r} must name rates in (0, 10000] req/s")
    return out


@aladdin_app.command("config")
def aladdin_config(
    model: Annotated[str, typer.Option("--model", help="Catalog model.")] = "llama-2-70b",
    gpu: Annotated[str, typer.Option("--gpu", help="Catalog GPU.")] = "a100",
    tp: Annotated[
        str, typer.Option("--tp", help="TP degrees to compare, e.g. 1,2,4,8.")
    ] = "1,2,4,8",
    slo_ttft_ms: Annotated[
        float, bounded(Millis, "--slo-ttft-ms", help="Prefill (TTFT) SLO.")
    ] = 1600.0,
    slo_atgt_ms: Annotated[
        float, bounded(Millis, "--slo-atgt-ms", help="Decode (ATGT) SLO.")
    ] = 75.0,
    mix: Annotated[str, typer.Option("--mix", help="Length mix of the history.")] = "sharegpt",
    link: Annotated[
        str | None, typer.Option("--link", help="nvlink or pcie (default: NVLink if any).")
    ] = None,
    vidur_dir: Annotated[
        str, typer.Option("--vidur-dir", help="Vidur profiling folder (network/ inside).")
    ] = "../shared/vidur-profiling",
    kv_utilization: Annotated[
        float, bounded(Fraction, "--kv-utilization", help="GPU memory fraction for KV.")
    ] = 0.9,
    as_json: JsonOpt = False,
) -> None:
    """Aladdin §4.1: per-GPU throughput of each TP degree (Eq. 5–6) and the best one."""
    from sloserve.cluster.aladdin.worker_config import worker_config_for

    wc = worker_config_for(
        model,
        gpu,
        _degrees(tp),
        atgt_s=slo_atgt_ms / 1e3,
        mix=mix,
        link=link,
        vidur_dir=vidur_dir,
        kv_utilization=kv_utilization,
    )
    if as_json:
        sys.stdout.write(json.dumps(wc.report(), indent=2) + "\n")
        return
    t = new_table(
        "GPUs/worker",
        "KV tokens",
        "KV batch",
        "SLO batch",
        "tokens/s per GPU",
        title=f"{model} on {gpu}, ATGT {slo_atgt_ms:g} ms (m_r {wc.m_r:.0f} tokens)",
    )
    for o in wc.options:
        if not o.feasible:
            t.add_row(str(o.gpus), "-", "-", "-", o.why)
            continue
        t.add_row(
            str(o.gpus),
            str(o.kv_tokens),
            f"{o.kv_batch:.0f}",
            str(o.slo_batch),
            f"{o.per_gpu_tokens_s:.0f}",
        )
    console.print(t)
    console.print(f"best: {wc.best_gpus} GPU(s) per worker", highlight=False)


@reproduce_app.command("aladdin")
def reproduce_aladdin(
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("runs/aladdin"),
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="Llama-2-70B on the PCIe A100 testbed, three rates, 30 s each, one testbed "
            "machine, the all-reduce what-if and the planner gap (a few minutes).",
        ),
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="Workload seed.", min=0)] = 0,
    rates: Annotated[
        str | None,
        typer.Option(
            "--rates", help="Arrival rates (req/s, comma-separated) instead of the plan's."
        ),
    ] = None,
) -> None:
    """Aladdin §6 in simulation: the fewest GPUs meeting the SLOs per router and rate (Figs.
    11/12), attainment and P99 ATGT on one machine (Figs. 9/10), the scheduling overhead
    (Fig. 13), Aladdin's analytic N_w beside our search and the capacity planner's, the
    all-reduce what-if, and the headline beside the paper's (headline.json)."""
    import dataclasses

    from sloserve.experiments.aladdin import Plan, reproduce

    plan = Plan.quick(seed) if quick else Plan.full(seed)
    if rates is not None:
        chosen = _rates(rates)
        split = None if plan.split_rates is None else (max(chosen),)
        plan = dataclasses.replace(plan, rates=chosen, split_rates=split)
    rep = reproduce(plan, out)
    t = new_table("scenario", "arm", "rate", "GPUs", "attainment", title="GPUs needed for the SLOs")
    for r in rep.gpus.itertuples():
        t.add_row(str(r.scenario), str(r.arm), f"{r.rate:g}", str(r.gpus), f"{r.attainment:.1%}")
    console.print(t)
    h = new_table(
        "scenario", "comparison", "ours", "paper", title="Headline: GPU change of Aladdin"
    )
    for sc, d in rep.headline["ours"].items():
        for k, v in d.items():
            paper = rep.headline["paper"].get(k)
            h.add_row(sc, k, f"{v:+.0%}", "-" if paper is None else f"{paper:+.0%}")
    console.print(h)
    for sc, law in rep.headline["worker_law"].items():
        console.print(
            f"{sc}: N_w = ceil({law['k5']:.3g}·r + {law['c5']:.3g}); predicted GPUs "
            f"{law['predicted']} vs simulated {law['simulated']}",
            highlight=False,
        )
    _print_extras(rep)
    console.print(f"gpus.csv, headline.json and the figures written to {out}", highlight=False)


def _print_extras(rep: Reproduction) -> None:
    """Figs. 9/10 (testbed), Fig. 13 (scheduling overhead), the all-reduce what-if and item
    9 (planner gap)."""
    import math

    import pandas as pd

    if rep.testbed is not None:
        t = new_table(
            "scenario",
            "arm",
            "rate",
            "GPUs",
            "attainment",
            "P99 ATGT (ms)",
            title="Figs. 9/10: one 4-GPU machine",
        )
        for r in rep.testbed.itertuples():
            t.add_row(
                str(r.scenario),
                str(r.arm),
                f"{r.rate:g}",
                str(r.gpus),
                f"{r.attainment:.1%}",
                f"{r.p99_atgt_ms:.0f}",
            )
        console.print(t)
    al = rep.gpus[rep.gpus["arm"] == "aladdin"]
    t = new_table(
        "scenario",
        "rate",
        "workers",
        "ms/decision",
        "ms per s of traffic",
        title="Fig. 13: Aladdin's scheduling overhead (CPU)",
    )
    for r in al.itertuples():
        if not math.isnan(float(r.sched_ms_per_decision)):  # type: ignore[arg-type]
            t.add_row(
                str(r.scenario),
                f"{r.rate:g}",
                str(r.workers),
                f"{r.sched_ms_per_decision:.3f}",
                f"{r.sched_ms_per_s:.2f}",
            )
    console.print(t)
    if rep.whatif is not None:
        t = new_table(
            "scenario",
            "extra µs per all-reduce",
            "lone decode (ms)",
            "rate",
            "vLLM default GPUs",
            "Aladdin GPUs",
            "Aladdin vs it",
            title="What-if: vLLM's whole-machine worker with slower all-reduces",
        )
        for r in rep.whatif.itertuples():
            ch = "-" if pd.isna(r.change) else f"{float(r.change):+.0%}"  # type: ignore[arg-type]
            t.add_row(
                str(r.scenario),
                f"{r.extra_us:g}",
                f"{r.lone_ms:.1f}",
                f"{r.rate:g}",
                str(r.gpus),
                str(r.aladdin_gpus),
                ch,
            )
        console.print(t)
    if rep.planner_gap is not None:
        cols = [c for c in rep.planner_gap.columns if c != "scenario"]
        t = new_table("scenario", *cols, title="Item 9: Eq. 7's GPUs vs the capacity planner's")
        for r in rep.planner_gap.itertuples(index=False):
            t.add_row(*(f"{v:g}" if isinstance(v, float) else str(v) for v in r))
        console.print(t)
