"""Cluster simulation at scale: N requests over R replicas, time and peak memory per point.

Each point runs in a fresh process (its own peak RSS, ``ru_maxrss`` of the child) under a
wall-clock limit (``--time-limit``, seconds; a point past it is killed and reported as
such). The workload is the issue's: lengths drawn from the Azure LLM inference
conversation trace (2023; Microsoft, CC-BY 4.0, read from ../shared/traces, never copied
here) as ``sim_speed.py`` draws them, Poisson arrivals at 1 req/s per replica (so every
point loads its replicas alike), Llama-2-70B on 2×A100 replicas with 128 running / 4,096
tokens per batch, Sarathi, the least-outstanding router. The time covers building the
requests, the simulation, the request table and the summary (not the interpreter start).

A point is skipped when the point before it took more than ``--skip-after`` seconds (the
1M×256 point runs only if the 100k point took under a minute).

    python benchmarks/cluster_scale.py [--points 10000x4,100000x16,1000000x256]
                                       [--time-limit 900] [--skip-after 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_speed import TRACE, azure_requests  # the same length sampling

PROFILE = "llama-2-70b-a100x2"


def one(n: int, replicas: int) -> dict[str, object]:
    """Run one point in this process; the parent measures its peak memory."""
    from sloserve.cluster.config import ClusterConfig
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.runner import InstanceConfig, SimConfig
    from sloserve.workloads.spec import WorkloadSpec

    t0 = time.perf_counter()
    reqs = azure_requests(n)
    for r in reqs:
        r.arrival /= replicas  # 1 req/s per replica
    t_build = time.perf_counter() - t0
    cfg = SimConfig(
        workload=WorkloadSpec(),
        instance=InstanceConfig(profile=PROFILE, max_running=128, max_batch_tokens=4096),
        policy="sarathi",
    )
    ccfg = ClusterConfig.model_validate(
        {"replicas": [{"profile": PROFILE, "count": replicas}], "router": "least-outstanding"}
    )
    t1 = time.perf_counter()
    res = simulate_cluster(cfg, ccfg, reqs)
    t_sim = time.perf_counter() - t1
    s = res.summary
    return {
        "requests": n,
        "replicas": replicas,
        "finished": s["finished"],
        "iterations": s["iterations"],
        "scheduling_decisions": s["scheduling_decisions"],
        "build_s": round(t_build, 2),
        "simulate_s": round(t_sim, 2),
        "us_per_request": round(t_sim / n * 1e6, 1),
    }


def run_point(n: int, replicas: int, limit: float) -> dict[str, object]:
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, __file__, "--one", str(n), str(replicas)], stdout=out
        )
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.kill()
        _, status, usage = os.wait4(proc.pid, 0) if proc.returncode is None else (0, 0, None)
        wall = time.perf_counter() - t0
        row: dict[str, object] = {"requests": n, "replicas": replicas}
        if usage is None:  # reaped by wait(): ask the kernel for the children's peak
            import resource

            peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            code = proc.returncode
        else:
            peak_kib = usage.ru_maxrss
            code = os.waitstatus_to_exitcode(status)
        if code != 0:
            row["error"] = f"killed after {limit:.0f} s" if wall >= limit else f"exit {code}"
        else:
            out.seek(0)
            row.update(json.loads(out.read()))
        row["wall_s"] = round(wall, 2)
        row["peak_rss_mib"] = round(peak_kib / 1024, 1)
        return row


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--points", default="10000x4,100000x16,1000000x256")
    ap.add_argument("--time-limit", type=float, default=900.0, help="seconds per point")
    ap.add_argument("--skip-after", type=float, default=60.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not TRACE.exists():
        print(f"missing {TRACE}", file=sys.stderr)
        return 2
    if args.one:
        print(json.dumps(one(*args.one)))
        return 0
    rows: list[dict[str, object]] = []
    for point in args.points.split(","):
        n, r = (int(x) for x in point.lower().split("x"))
        if rows and (rows[-1].get("error") or float(rows[-1]["wall_s"]) > args.skip_after):
            rows.append({"requests": n, "replicas": r, "skipped": "previous point too slow"})
        else:
            rows.append(run_point(n, r, args.time_limit))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
