"""Run a fixed set of simulations and print their JSON summaries, for before/after diffs.

A restructure (moving code between modules) must not change any result. Run this on the
commit before and the commit after and diff the two files:

    python scripts/summary_snapshot.py > before.json      # on the old commit
    python scripts/summary_snapshot.py > after.json       # on the new commit
    python scripts/summary_snapshot.py --diff before.json after.json

Wall-clock fields (``wall_seconds`` and anything timing the host) are dropped: they differ
from run to run. Everything else — every latency, count and attainment — must be equal.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

# Every policy family, both KV managers, QoE rules, SLO rules, a trace-free closed loop and
# the exact solver: the paths a restructure of policies/, optimal/ and experiments/ touches.
RUNS: list[list[str]] = [
    ["simulate", "--policy", "vllm", "--workload", "sharegpt", "--rate", "6", "--duration", "60"],
    ["simulate", "--policy", "sarathi", "--workload", "sharegpt", "--rate", "6",
     "--duration", "60"],
    ["simulate", "--policy", "vllm-ef", "--workload", "lmsys", "--rate", "4", "--duration", "60"],
    ["simulate", "--policy", "edf", "--workload", "sharegpt", "--rate", "8", "--duration", "60",
     "--slo", "bros"],
    ["simulate", "--policy", "rank-output", "--workload", "sharegpt", "--rate", "8",
     "--duration", "60"],
    ["simulate", "--policy", "andes", "--workload", "sharegpt", "--arrival", "bursty",
     "--rate", "11", "--duration", "60", "--reading-speed", "reading"],
    ["simulate", "--policy", "lqsf", "--workload", "sharegpt", "--rate", "11", "--duration", "60",
     "--reading-speed", "reading"],
    ["simulate", "--policy", "bros", "--workload", "sharegpt", "--rate", "10", "--duration", "60",
     "--slo", "bros"],
    ["simulate", "--policy", "bros-nobicache", "--workload", "sharegpt", "--rate", "10",
     "--duration", "60", "--slo", "bros"],
    ["simulate", "--policy", "rr", "--workload", "sharegpt", "--rate", "10", "--duration", "60",
     "--slo", "bros"],
    ["simulate", "--policy", "sarathi", "--workload", "sharegpt", "--rate", "2", "--duration", "60",
     "--profile", "llama-2-70b-a100x2"],
    # The cluster layer: routing over replicas with a failure mid-run, and QLM's planner.
    ["simulate", "--policy", "sarathi", "--workload", "sharegpt", "--rate", "12", "--duration",
     "60", "--replicas", "3", "--router", "power-of-two"],
    ["simulate", "--policy", "vllm", "--workload", "sharegpt", "--rate", "8", "--duration", "60",
     "--replicas", "2", "--router", "qlm"],
    ["optimal", "--requests", "3", "--input", "32", "--output", "3", "--kv-capacity", "64"],
]

VOLATILE = {"wall_seconds", "solve_seconds"}


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def snapshot() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for args in RUNS:
        cmd = [sys.executable, "-m", "sloserve.cli", *args, "--json"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[" ".join(args)] = _clean(json.loads(res.stdout))
    return out


def diff(a_path: str, b_path: str) -> int:
    with open(a_path) as f:
        a = json.load(f)
    with open(b_path) as f:
        b = json.load(f)
    bad = 0
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            bad += 1
            print(f"DIFFERS: {key}")
    print(f"{len(set(a) | set(b)) - bad} identical, {bad} different")
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two snapshots")
    ns = ap.parse_args()
    if ns.diff:
        sys.exit(diff(*ns.diff))
    json.dump(snapshot(), sys.stdout, indent=1, sort_keys=True)
    print()
