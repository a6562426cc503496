"""Execute mode on a GPU: measured vs predicted iteration times, and tokens/s.

Run (one GPU, ~3 minutes in all):

    PYTHONPATH=src python3 benchmarks/execute_gpu.py --out DIR
    PYTHONPATH=src python3 benchmarks/execute_gpu.py --out DIR --smoke   # tiny model, CPU

Needs (third-party): torch (a CUDA build), numpy, pandas, pydantic, pyyaml; the cost-model
fit uses numpy only. Not needed: typer, rich, fastapi, safetensors, tokenizers (random
weights). Budget: under 4 minutes on an H100/H200 including calibration. What it does:

1. Builds a Llama-2-7B-shaped model with random bf16 weights on cuda (``--smoke``: the
   2-layer ``tiny`` model in float32 on the CPU).
2. Calibrates a profile on this device (:func:`sloserve.experiments.execute_calibrate.
   calibrate`, a small grid) and writes it to DIR/calibrated.yaml (+ .csv).
3. Runs vllm, sarathi and andes at two loads (Poisson arrivals, ShareGPT lengths clipped to
   ``--max-context`` tokens) in execute mode, with the shipped profile
   (llama-2-7b-h100) predicting each iteration; then scores the same iterations against the
   calibrated profile; then simulates the same requests with each profile's cost model.
4. Writes DIR/execute_gpu.json and DIR/execute_gpu.md: per policy and load, the median and
   p90 relative error of predicted vs measured iteration time against both profiles, and
   measured tokens/s vs the simulator's prediction.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from sloserve.costmodel.profiler.grid import profile_grid
from sloserve.engine.execute import load_model, timing_report
from sloserve.engine.execute.torch_executor import IterationRecord
from sloserve.engine.executor import price
from sloserve.experiments.execute_calibrate import calibrate, measure_grid
from sloserve.experiments.execute_run import simulate_execute
from sloserve.experiments.runner import InstanceConfig, SimConfig, simulate
from sloserve.workloads.arrivals import PoissonArrivals
from sloserve.workloads.spec import WorkloadSpec, build_workload

POLICIES = ("vllm", "sarathi", "andes")


def _shipped() -> str:
    from sloserve.costmodel.profile import profile_names

    names = set(profile_names())
    return "llama-2-7b-h100" if "llama-2-7b-h100" in names else "llama-2-7b-a100"


def _tokens_per_s(summary: dict[str, Any]) -> float:
    tps = summary.get("output_tokens_per_s")
    if tps is None:
        tps = summary.get("throughput_tokens_per_s", 0.0)
    return float(tps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU, seconds")
    ap.add_argument("--requests", type=int, help="requests per run (24; --smoke: 4)")
    ap.add_argument("--max-context", type=int, default=512)
    ap.add_argument("--rates", default="2,8", help="two loads, requests/s")
    ap.add_argument("--warmup-s", type=float, default=20.0, help="GPU warm-up before timing")
    a = ap.parse_args()
    t0 = time.perf_counter()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.smoke:
        loaded = load_model(model_spec="tiny", device="cpu")
        n, ctx, rates = a.requests or 4, 32, [float(r) for r in a.rates.split(",")]
        grid: dict[str, Any] = {
            "prefill_chunks": (8, 32),
            "decode_batches": (1, 4),
            "contexts": (0, 16),
            "repeats": 1,
            "warmup": 0,
        }
    else:
        loaded = load_model(model_spec="llama-2-7b", device="cuda", dtype="bfloat16")
        n, ctx, rates = a.requests or 24, a.max_context, [float(r) for r in a.rates.split(",")]
        grid = {
            "prefill_chunks": (32, 128, 512),
            "decode_batches": (1, 4, 8, 16, 32),
            "contexts": (0, 128, 256, 512),
            "repeats": 7,
            "warmup": 2,
        }
    if a.warmup_s > 0 and not a.smoke:
        # A GPU that idled clocks down, and the first iterations of each shape pay for
        # allocator growth and kernel selection: the first run of an earlier try measured
        # 2-3x the steady iteration time. Warm up on a mid-size mixed batch first.
        warm = profile_grid((128,), (8,), (256,), True)
        t_w = time.perf_counter()
        while time.perf_counter() - t_w < a.warmup_s:
            measure_grid(loaded, warm, warmup=0, repeats=20)
    shipped = _shipped()
    cal_path = a.out / "calibrated.yaml"
    cal, _csv = calibrate(loaded, cal_path, name="calibrated", **grid)
    cal_cm = cal.cost_model()
    t_cal = time.perf_counter() - t0
    kv_tokens = 4096 if a.smoke else 32768
    rows: list[dict[str, Any]] = []
    iters = ["policy,rate,i,kind,tokens,measured_s,predicted_s,run_start_s"]
    for rate in rates:
        spec = WorkloadSpec(
            mix="sharegpt", arrival=PoissonArrivals(rate=rate), num_requests=n, seed=0
        )
        reqs = build_workload(spec, max_context=ctx).requests
        for policy in POLICIES:
            cfg = SimConfig(
                workload=spec,
                instance=InstanceConfig(profile=shipped, kv_capacity_tokens=kv_tokens),
                policy=policy,
            )
            t_run = time.perf_counter()
            res, ex = simulate_execute(cfg, loaded, reqs)
            iters.extend(
                f"{policy},{rate:g},{i},{r.kind},{r.num_tokens},{r.measured_s:.6f},"
                f"{r.predicted_s:.6f},{t_run - t0:.1f}"
                for i, r in enumerate(ex.records)
            )
            recal = [
                IterationRecord(r.kind, r.num_tokens, r.measured_s, p)
                for r, p in zip(ex.records, _reprice(ex, cal_cm), strict=True)
            ]
            sim_ship = simulate(cfg, reqs).summary
            sim_cal = simulate(
                cfg.model_copy(
                    update={"instance": cfg.instance.model_copy(update={"profile": str(cal_path)})}
                ),
                reqs,
            ).summary
            rows.append(
                {
                    "policy": policy,
                    "rate": rate,
                    "requests": n,
                    "iterations": len(ex.records),
                    "vs_shipped": timing_report(ex.records),
                    "vs_calibrated": timing_report(recal),
                    "measured_tokens_per_s": _tokens_per_s(res.summary),
                    "simulated_tokens_per_s_shipped": _tokens_per_s(sim_ship),
                    "simulated_tokens_per_s_calibrated": _tokens_per_s(sim_cal),
                }
            )
            print(
                f"{policy} rate {rate}: {len(ex.records)} iterations, "
                f"{time.perf_counter() - t0:.0f} s elapsed",
                flush=True,
            )
    report = {
        "device": str(loaded.model.device),
        "model": loaded.name,
        "dtype": str(loaded.model.dtype).removeprefix("torch."),
        "shipped_profile": shipped,
        "calibrated_profile": str(cal_path),
        "calibration_s": t_cal,
        "calibration_fit": cal.fit_report.get("total"),
        "runs": rows,
        "wall_s": time.perf_counter() - t0,
    }
    (a.out / "execute_gpu.json").write_text(json.dumps(report, indent=2, default=str))
    (a.out / "execute_gpu.md").write_text(_markdown(report))
    (a.out / "iterations.csv").write_text("\n".join(iters) + "\n")
    print(_markdown(report))


def _reprice(ex: Any, cm: Any) -> list[float]:
    """The calibrated model's price for each iteration the executor recorded."""
    return [price(cm, r.stats, r.overlap_swap) for r in ex.records]


def _markdown(rep: dict[str, Any]) -> str:
    lines = [
        f"Execute mode: {rep['model']} ({rep['dtype']}) on {rep['device']}; shipped profile "
        f"{rep['shipped_profile']}, calibrated here in {rep['calibration_s']:.0f} s.",
        "",
        "| policy | rate | iters | shipped med / p90 err | calibrated med / p90 err "
        "| measured tok/s | sim tok/s (shipped) | sim tok/s (calibrated) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["runs"]:
        s, c = r["vs_shipped"]["all"], r["vs_calibrated"]["all"]
        lines.append(
            f"| {r['policy']} | {r['rate']:g} | {r['iterations']} | "
            f"{s['median_rel_err']:.1%} / {s['p90_rel_err']:.1%} | "
            f"{c['median_rel_err']:.1%} / {c['p90_rel_err']:.1%} | "
            f"{r['measured_tokens_per_s']:.0f} | {r['simulated_tokens_per_s_shipped']:.0f} | "
            f"{r['simulated_tokens_per_s_calibrated']:.0f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
