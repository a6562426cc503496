"""Simulator speed benchmark (issue: simulation core, performance).

Workload shape of Vidur's published benchmark: N requests with lengths sampled from the
Azure LLM inference conversation trace (2023; Microsoft, CC-BY 4.0, read from
../shared/traces/azure_llm_2023_conv.csv, never copied here), Poisson arrivals at 1 req/s,
one Llama-2-70B replica on 2×A100 (TP2), batch cap R_max=128, C=4096 tokens per batch.
Prompt+output are clipped to the model's 4,096-token context (Llama-2). Reports wall
seconds (simulation plus metrics, excluding building the request list), simulated
batches/s, token-steps/s (prompt + generated tokens processed per wall second) and peak
resident memory for 1×, 2× and 4× 16,384 requests, for the vllm and sarathi policies.
Each run is a fresh subprocess so that peak memory is its own.

    python benchmarks/sim_speed.py [--requests 16384] [--scales 1,2,4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sloserve.core.request import Request
from sloserve.experiments.runner import InstanceConfig, SimConfig, simulate
from sloserve.workloads.spec import WorkloadSpec

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023_conv.csv"


def azure_requests(n: int, seed: int = 0, context: int = 4096) -> list[Request]:
    df = pd.read_csv(TRACE)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(df), size=n)
    prompt = np.minimum(df["ContextTokens"].to_numpy()[idx], context - 1).clip(1)
    output = np.minimum(df["GeneratedTokens"].to_numpy()[idx].clip(1), context - prompt)
    arrivals = np.cumsum(rng.exponential(1.0, size=n))
    return [
        Request(
            req_id=i,
            arrival=float(arrivals[i]),
            num_prompt_tokens=int(prompt[i]),
            true_output_len=int(output[i]),
        )
        for i in range(n)
    ]


def run(policy: str, reqs: list[Request]) -> dict[str, float]:
    cfg = SimConfig(
        workload=WorkloadSpec(),
        instance=InstanceConfig(
            profile="llama-2-70b-a100x2", max_running=128, max_batch_tokens=4096
        ),
        policy=policy,
    )
    t0 = time.perf_counter()
    res = simulate(cfg, reqs)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    batches = res.summary["iterations"]
    token_steps = int(res.table["generated_tokens"].sum() + res.table["prompt_tokens"].sum())
    return {
        "policy": policy,
        "requests": len(reqs),
        "finished": res.summary["finished"],
        "wall_s": round(wall, 3),
        "batches": batches,
        "batches_per_s": round(batches / wall),
        "token_steps_per_s": round(token_steps / wall),
        "peak_mem_mib": round(peak / 2**20, 1),
        "simulated_s": round(res.summary["simulated_seconds"], 1),
        "scheduling_decisions": res.summary["scheduling_decisions"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=16384)
    ap.add_argument("--scales", default="1,2,4")
    ap.add_argument("--policies", default="vllm,sarathi")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", nargs=2, metavar=("POLICY", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not TRACE.exists():
        print(f"missing {TRACE}", file=sys.stderr)
        return 2
    if args.one:
        print(json.dumps(run(args.one[0], azure_requests(int(args.one[1])))))
        return 0
    rows = []
    for scale in (int(s) for s in args.scales.split(",")):
        for policy in args.policies.split(","):
            out = subprocess.run(
                [sys.executable, __file__, "--one", policy, str(args.requests * scale)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            row = json.loads(out)
            row["scale"] = scale
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
