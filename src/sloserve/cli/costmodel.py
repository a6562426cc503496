"""CLI commands: the ``costmodel`` group and ``profile`` (registered on import by
``sloserve.cli``).

``sloserve costmodel show`` prints a profile's KV capacity, prefill and decode times;
``sloserve costmodel fit`` fits the InferMax/Vidur linear model to measured iterations;
``sloserve profile`` measures a real PyTorch model into such a CSV (PyTorch loads only here).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from sloserve.cli._app import app, console
from sloserve.cli._bounded import bounded
from sloserve.cli._console import new_table
from sloserve.core.bounds import Count, Degree, Fraction, Index, Millis, Workers
from sloserve.core.errors import SloserveError

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
    tp: Annotated[int, bounded(Degree, "--tp", help="Tensor-parallel degree.")] = 1,
    utilization: Annotated[
        float, bounded(Fraction, "--utilization", help="GPU memory fraction for vLLM.")
    ] = 0.9,
    tpot_ms: Annotated[
        float, bounded(Millis, "--tpot-ms", help="TPOT target for the max batch size.")
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
    t = new_table("decode step (ms)", *(f"ctx {c}" for c in d["decode"]["contexts"]))
    for b, row, fits in zip(
        d["decode"]["batch_sizes"], d["decode"]["step_ms"], d["decode"]["fits_kv"], strict=True
    ):
        t.add_row(
            f"batch {b}",
            *(f"{v:.1f}" + ("" if ok else " (>M)") for v, ok in zip(row, fits, strict=True)),
        )
    console.print(t)
    t2 = new_table(
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
    tp: Annotated[int | None, bounded(Degree, "--tp", help="Tensor-parallel degree.")] = None,
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
    repeats: Annotated[int, bounded(Count, "--repeats", help="Timed runs per shape.")] = 5,
    warmup: Annotated[int, bounded(Index, "--warmup", help="Untimed runs first.")] = 2,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="float32, float16 or bfloat16.")
    ] = None,
    cpu_threads: Annotated[
        int | None, bounded(Workers, "--cpu-threads", help="Torch CPU threads.")
    ] = None,
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
