"""Trace loading benchmark: load the full Azure LLM inference trace (2023, conversation
service; Microsoft Azure Public Dataset, CC-BY 4.0, read from ../shared/traces, never
copied here) and turn it into simulator requests. Target: under 1 s.

Also reports, separately, how long simulating the whole hour takes on one replica
(Llama-2-70B on 2×A100 by default), which is not part of the target.

    python benchmarks/trace_replay.py [--simulate] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from sloserve.experiments.runner import InstanceConfig, SimConfig, simulate
from sloserve.workloads.spec import WorkloadSpec, build_workload

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023_conv.csv"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--simulate", action="store_true", help="also simulate the whole trace")
    ap.add_argument("--profile", default="llama-2-70b-a100x2")
    args = ap.parse_args()
    if not TRACE.exists():
        print(f"missing {TRACE}", file=sys.stderr)
        return 2
    spec = WorkloadSpec(trace=str(TRACE), trace_format="azure")
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        wl = build_workload(spec)
        times.append(time.perf_counter() - t0)
    row: dict[str, object] = {
        "requests": len(wl.requests),
        "load_and_build_s_median": round(statistics.median(times), 3),
        "load_and_build_s_max": round(max(times), 3),
    }
    if args.simulate:
        cfg = SimConfig(workload=spec, instance=InstanceConfig(profile=args.profile), policy="vllm")
        t0 = time.perf_counter()
        res = simulate(cfg, wl)
        row["simulate_s"] = round(time.perf_counter() - t0, 2)
        row["finished"] = res.summary["finished"]
        row["rejected"] = res.summary["rejected"]
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
