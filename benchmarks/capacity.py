"""Capacity planner benchmark (issue 18, performance).

Workload: a 10-minute window of the Azure LLM inference conversation trace (2023;
Microsoft, CC-BY 4.0, read from ../shared/traces/azure_llm_2023_conv.csv, never copied
here), replayed time-scaled to the target rate, prompt+output clipped to Llama-2's 4,096
tokens; SLO ``ttft_p90=2s,tpot_p90=100ms`` at an attainment of 0.95.

* ``point``: one capacity point — one rate (8 req/s), least-loaded + Sarathi on
  Llama-2-70B / 2×A100, the fewest replicas by bracketing and bisection (one seed).
  Issue target: <= 30 s on the development machine.
* ``search``: a search over profiles × routers × policies (2 × 2 × 2 arms, replica counts
  1..32: 256 configurations) at one rate. Issue target: <= 60 s for >= 200 configurations.
* ``--screen F``: the screening share of the window (default 0.25; 0: search the whole
  window directly, as before screening existed).
* ``--ray``: the same search again on a local Ray with the same number of CPUs; the answers
  must be identical (they are compared and the result printed).

    python benchmarks/capacity.py [--parts point,search] [--workers 2] [--ray]
                                  [--rate 8] [--screen 0.25] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023_conv.csv"
SLO = "ttft_p90=2s,tpot_p90=100ms"
ATTAINMENT = 0.95


def workload() -> dict[str, Any]:
    return {
        "workload": {
            "trace": str(TRACE),
            "trace_format": "azure",
            "duration_s": 600,
            "replay": {"max_context": 4096},
            "slo": "none",
        },
        "instance": {"profile": "llama-2-70b-a100x2"},
    }


def run(name: str, executor: Any, rate: float, screen: float, **space: Any) -> dict[str, Any]:
    import sloserve

    t0 = time.perf_counter()
    res = sloserve.plan_capacity(
        workload(),
        slo=SLO,
        attainment=ATTAINMENT,
        rates=[rate],
        seeds=[0],
        executor=executor,
        screen=screen or None,
        **space,
    )
    wall = time.perf_counter() - t0
    cols = [
        "profile",
        "router",
        "policy",
        "replicas",
        "gpus",
        "attainment",
        "neighbour_replicas",
        "neighbour_attainment",
    ]
    answers = res.answers[cols].to_dict("records")
    stopped = int(res.probes["stopped_at_s"].notna().sum())
    out = {
        "part": name,
        "executor": getattr(executor, "name", str(executor)),
        "workers": getattr(executor, "workers", None),
        "wall_s": round(wall, 2),
        "simulations": res.simulations,
        "stopped_early": stopped,
        "rounds": res.rounds,
        "configurations": res.configurations,
        "checks": res.checks,
        "answers": answers,
    }
    print(json.dumps(out, default=str))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="point,search")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rate", type=float, default=8.0)
    ap.add_argument("--ray", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--screen", type=float, default=0.25, help="screening share of the window (0: off)"
    )
    args = ap.parse_args()
    from sloserve.experiments.executor import LocalExecutor

    parts = args.parts.split(",")
    point = {"profiles": "llama-2-70b-a100x2", "routers": "least-loaded", "policies": "sarathi"}
    search = {
        "profiles": "llama-2-70b-a100x2,llama-2-70b-h100x2",
        "routers": "least-loaded,round-robin",
        "policies": "vllm,sarathi",
    }
    results = []
    with LocalExecutor(args.workers) as ex:
        if "point" in parts:
            results.append(run("point", ex, args.rate, args.screen, **point))
        if "search" in parts:
            results.append(run("search", ex, args.rate, args.screen, **search))
    if args.ray:
        from sloserve.experiments.executor import RayExecutor

        ray_ex = RayExecutor(args.workers)
        on_ray = run("search-ray", ray_ex, args.rate, args.screen, **search)
        local = next((r for r in results if r["part"] == "search"), None)
        if local is not None:
            same = on_ray["answers"] == local["answers"]
            print(json.dumps({"ray_answers_identical": same}))
            on_ray["identical_to_local"] = same
        results.append(on_ray)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
