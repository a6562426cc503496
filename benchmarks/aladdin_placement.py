"""Aladdin placement overhead: wall time of one Algorithm 1 decision (``Placement.place``).

Setup: the §3 models fitted to Llama-2-70B on two PCIe A100s (``llama-2-70b@a100-80gb-pciex2``,
the paper's Table 3 worker) with Table 2's SLOs (1600 / 75 ms) and the paper's knobs
(γ = 0.5, θ = 0.9). ``W`` workers hold ``N`` ongoing requests between them (N/W each, dealt
round robin), each with ShareGPT-like lengths (the ``sharegpt`` mix) placed at a random
time in the last 30 s, so their progress, re-predictions and KV footprints differ. Each
timed decision places one new ShareGPT request at t = 0 on the best-fit worker (or finds
none: with many requests per worker every constraint check runs for every worker, the
worst case), then takes it out again so that N stays fixed. Only ``place`` is timed.
With ``--groups n`` (Appendix A's distributed scheduling) each decision sees only the
W/n workers of the group the request is dealt to (round robin).

One JSON line per (N, W): decisions, decisions per second, mean / p50 / p99 milliseconds of
wall time, the mean CPU milliseconds of this process per decision (``cpu_mean_ms``,
``time.process_time``: on a loaded shared machine wall time also counts the time other
processes held the core) and the share of decisions that found a worker. Each
configuration runs ``--repeat`` times and the run with the lowest mean is reported (noise on
a shared machine only adds time).

    python benchmarks/aladdin_placement.py [--sizes 1000,10000,100000] [--workers 16,64,256]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from sloserve.cluster.aladdin.lengths import LengthPredictor, history
from sloserve.cluster.aladdin.perf_models import GIB, fit_profile
from sloserve.cluster.aladdin.placement import Placed, Placement, Slo
from sloserve.costmodel.profile import load_profile

PROFILE = "llama-2-70b@a100-80gb-pciex2"


def build(n: int, workers: int, seed: int = 0) -> tuple[Placement, np.ndarray]:
    """A placement with ``n`` ongoing requests over ``workers`` workers, and new prompts."""
    prof = load_profile(PROFILE)
    kv_gib = prof.kv_capacity_tokens(0.9) * prof.kv_bytes_per_token / GIB
    p, o = history("sharegpt")
    pl = Placement(fit_profile(PROFILE), Slo(1.6, 0.075), LengthPredictor(p, o))
    for w in range(workers):
        pl.add_worker(w, kv_gib)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(p), size=n)
    ages = rng.uniform(0.0, 30.0, size=n)
    for i in range(n):
        wid = i % workers
        l_in = int(p[idx[i]])
        pl.workers[wid].requests[i] = Placed(i, l_in, pl.predictor.predict(l_in), -ages[i])
        pl.where[i] = wid
    new = p[rng.integers(0, len(p), size=4096)]
    return pl, new


def time_decisions(
    pl: Placement, new: np.ndarray, decisions: int, groups: int = 1
) -> tuple[np.ndarray, int, float]:
    cands = [[(w, 0) for w in pl.workers if w % groups == g] for g in range(groups)]
    times = np.empty(decisions)
    found = 0
    cpu = 0.0
    for k in range(decisions):
        rid = f"new-{k}"
        c0, t0 = time.process_time(), time.perf_counter()
        wid = pl.place(rid, int(new[k % len(new)]), 0.0, cands[k % groups])
        times[k] = time.perf_counter() - t0
        cpu += time.process_time() - c0
        if wid is not None:
            found += 1
            pl.remove(rid)
    return times, found, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000", help="ongoing requests N")
    ap.add_argument("--workers", default="16,64,256", help="worker counts W")
    ap.add_argument("--decisions", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--groups", type=int, default=1, help="Appendix A scheduler groups (1: central)"
    )
    args = ap.parse_args()
    for n in (int(x) for x in args.sizes.split(",")):
        for w in (int(x) for x in args.workers.split(",")):
            runs = []
            for _ in range(args.repeat):
                pl, new = build(n, w)
                runs.append(time_decisions(pl, new, args.decisions, args.groups))
            times, found, cpu = min(runs, key=lambda r: float(r[0].mean()))
            print(
                json.dumps(
                    {
                        "ongoing": n,
                        "workers": w,
                        "groups": args.groups,
                        "decisions": args.decisions,
                        "decisions_per_s": round(1.0 / float(times.mean()), 1),
                        "mean_ms": round(float(times.mean()) * 1e3, 3),
                        "p50_ms": round(float(np.percentile(times, 50)) * 1e3, 3),
                        "p99_ms": round(float(np.percentile(times, 99)) * 1e3, 3),
                        "cpu_mean_ms": round(cpu / args.decisions * 1e3, 3),
                        "found_share": found / args.decisions,
                        "runs_mean_ms": [round(float(r[0].mean()) * 1e3, 3) for r in runs],
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
