"""End-to-end simulation speed: process start to printed summary (issue 14, Performance).

Builds once (cached under ``--cache``, default ``$TMPDIR/sloserve-bench``) the 16,384-request
trace of the issue: lengths drawn from the Azure LLM inference conversation trace (2023;
Microsoft, CC-BY 4.0, read from ../shared/traces, never copied here) exactly as
``sim_speed.py`` draws them (prompt+output clipped to Llama-2's 4,096-token context),
Poisson arrivals at 1 req/s (single replica) and at 4 req/s (four replicas), written as
sloserve trace CSVs. Then times each run as a whole process, interpreter start-up,
imports, trace loading, simulation, summary and JSON output included:

* ``single``: ``python -m sloserve.cli simulate --trace t1.csv --policy vllm --profile
  llama-2-70b-a100x2 --max-running 128 --max-batch-tokens 4096 --json``
* ``cluster``: ``python -m sloserve.cli simulate --trace t4.csv --policy sarathi --profile
  llama-2-70b-a100x2 --max-running 128 --max-batch-tokens 4096 --replicas 4 --router
  least-outstanding --json``: the same limits on 4 replicas at 4 req/s.

Reports min/median wall seconds over ``--repeat`` runs (default 3), simulated iterations,
the largest peak RSS (``ru_maxrss`` of the finished child) and whether the children may
write and reuse bytecode (``bytecode_cache``: False under ``PYTHONDONTWRITEBYTECODE``,
when each run compiles sloserve's modules from source, ~0.07 s of CPU on this machine).

    python benchmarks/sim_e2e.py [--repeat 3] [--runs single,cluster] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

N = 16384
LIMITS = ["--max-running", "128", "--max-batch-tokens", "4096"]
PROFILE = "llama-2-70b-a100x2"


def build_trace(cache: Path, rate: float) -> Path:
    """The trace CSV at ``rate`` req/s (same lengths and exponential draws for every rate)."""
    path = cache / f"azure_conv_{N}_rate{rate:g}.csv"
    if path.exists():
        return path
    from sim_speed import azure_requests  # the same length sampling (it imports pandas)

    from sloserve.workloads.describe import export_trace

    reqs = azure_requests(N)
    if rate != 1.0:
        for r in reqs:
            r.arrival = r.arrival / rate
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    export_trace(reqs, tmp)
    tmp.replace(path)
    return path


def commands(cache: Path) -> dict[str, list[str]]:
    t1 = build_trace(cache, 1.0)
    t4 = build_trace(cache, 4.0)
    cli = [sys.executable, "-m", "sloserve.cli", "simulate", "--profile", PROFILE, *LIMITS]
    return {
        "single": [*cli, "--trace", str(t1), "--policy", "vllm", "--json"],
        "cluster": [
            *cli,
            "--trace",
            str(t4),
            "--policy",
            "sarathi",
            *["--replicas", "4", "--router", "least-outstanding", "--json"],
        ],
    }


def time_one(cmd: list[str]) -> tuple[float, int, dict[str, object]]:
    """Wall seconds, peak RSS (bytes) and the printed summary of one child process."""
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)}: exit status {proc.returncode}")
        out.seek(0)
        summary = json.loads(out.read())
    return wall, usage.ru_maxrss * 1024, summary  # ru_maxrss: KiB on Linux


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runs", default="single,cluster")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "sloserve-bench")
    ap.add_argument("--print-commands", action="store_true", help="print the commands only")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from sim_speed import TRACE

    if not TRACE.exists():
        print(f"missing {TRACE}", file=sys.stderr)
        return 2
    cmds = commands(args.cache)
    if args.print_commands:
        for name, cmd in cmds.items():
            print(f"{name}: {' '.join(cmd)}")
        return 0
    env_note = os.environ.get("PYTHONPATH", "")
    rows = []
    for name in args.runs.split(","):
        walls, peak, summary = [], 0, {}
        for _ in range(args.repeat):
            w, p, summary = time_one(cmds[name])
            walls.append(w)
            peak = max(peak, p)
        row = {
            "run": name,
            "requests": summary.get("num_requests", summary.get("finished")),
            "finished": summary.get("finished"),
            "iterations": summary.get("iterations"),
            "wall_s_min": round(min(walls), 3),
            "wall_s_median": round(statistics.median(walls), 3),
            "us_per_iteration": round(statistics.median(walls) / summary["iterations"] * 1e6, 1)
            if summary.get("iterations")
            else None,
            "peak_rss_mib": round(peak / 2**20, 1),
            "pythonpath": env_note,
            # Without cached bytecode every run compiles sloserve's modules first (measured
            # here: ~0.07 s of CPU of a run's ~0.35 s of imports); an installed package
            # has its .pyc files, so say which case a number is.
            "bytecode_cache": not sys.dont_write_bytecode,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
