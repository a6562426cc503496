"""Why two of QLM's LSO claims do not reproduce here, as upper bounds measured on the runs
themselves (``papers/qlm.txt`` §1: "model warm start improves throughput by 300 % in
multi-model serving, and request eviction improves SLO attainment by 80 % in single-model
serving").

**Warm start** (W_A, W_A_large; ``qlm`` and ``qlm-no-warm-start``, the quick plan's runs):
under a standing queue a replica's served requests per second scale with the time it is
not loading a model, so removing every load second (a free warm start) raises the window
throughput (requests finished while arrivals last ÷ that window, §8.1's "requests served
per second") by at most ``(R·T − L_on) / (R·T − L_off) − 1``: R replicas, T the window,
L the load seconds inside it with and without warm start. The paper's +300 % needs the
loads of QLM without warm start to fill at least 75 % of the window's replica time.

**Eviction, and any scheduling** (W_B at the queued rate and 20/50/80 % rt, W_C's
mega-prompts, Llama-2-70B; ``qlm-no-eviction``, ``qlm`` and ``edf-swap``, the paper's EDF):
§5's eviction swaps running requests for the head group's and keeps the batch full, so it
does not make a decode step faster; it lets a request that has reached its replica start
before a running one finishes. It shortens neither the wait before the request reaches its
replica (the plan and the pull) nor its own service (first scheduled → finished). So a
missed deadline is one eviction could save only if it would be met without the time the
request waited on its replica (``add_request`` → first scheduled, watched from outside):
``e2e − replica wait ≤ deadline``; and one *any* order, pull or eviction could save only if
its service alone was within the deadline (under the batch sizes that ran). Printed: the
misses, unfinished ones, those with service alone past the deadline, the savable ones, both
bounds (absolute and relative to the run's attainment), the latency-sensitive requests'
replica waits and the mean time between finishes on a replica (how often a slot frees).

    python benchmarks/qlm_limits.py                 # both parts
    python benchmarks/qlm_limits.py --part warm     # or: --part eviction
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any


def _run(run: Any, tweak: Any = None) -> tuple[Any, dict[int, float]]:
    """Simulate ``run`` (``experiments.qlm.plan.Run``); the result and each request's
    arrival at its replica (the last one: a requeued request is counted from its last)."""
    from sloserve.cluster.config import ClusterConfig
    from sloserve.engine.instance import Instance
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.qlm.reproduce import _workload
    from sloserve.experiments.runner import SimConfig

    sim, cluster = run.config()
    if tweak is not None:
        tweak(sim, cluster)
    at: dict[int, float] = {}
    orig = Instance.add_request

    def add_request(self: Any, req: Any) -> None:
        at[req.req_id] = self.env.now
        orig(self, req)

    Instance.add_request = add_request  # type: ignore[method-assign]
    try:
        cfg = SimConfig.model_validate(sim)
        res = simulate_cluster(cfg, ClusterConfig.load(cluster, run.key), _workload(cfg, run))
    finally:
        Instance.add_request = orig  # type: ignore[method-assign]
    return res, at


def warm(seed: int) -> None:
    from sloserve.experiments.qlm.plan import TAIL_SHARE, Plan

    runs = Plan.quick(seed).runs
    for wl in ("W_A", "W_A_large"):
        load_in: dict[str, float] = {}
        for system in ("qlm", "qlm-no-warm-start"):
            run = next(
                r
                for r in runs
                if r.workload == wl and r.system == system and r.tail_share == TAIL_SHARE
            )
            res, _ = _run(run)
            s, t = res.summary, run.duration_s
            reps = len(s["replicas"])
            loads = s["model_loads"]
            in_win = sum(max(0.0, min(ld["end_s"], t) - ld["start_s"]) for ld in loads)
            total = sum(ld["end_s"] - ld["start_s"] for ld in loads)
            by_tier: dict[str, float] = {}
            for ld in loads:
                by_tier[ld["tier"]] = by_tier.get(ld["tier"], 0.0) + ld["end_s"] - ld["start_s"]
            # served: finished (a rejected request has a finish time too)
            fin = [
                r.finish_time for r in res.requests if r.is_finished and r.finish_time is not None
            ]
            makespan = max(fin) if fin else 0.0
            served = sum(1 for f in fin if f <= t)
            load_in[system] = in_win
            tiers = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(by_tier.items()))
            print(
                f"{wl:9s} {system:17s} loads {len(loads)} ({tiers}); "
                f"in the {t:g} s window {in_win:.1f} s = {in_win / (reps * t):.1%} of {reps}×{t:g} "
                f"replica-s; all loads {total:.1f} s = {total / (reps * makespan):.1%} of "
                f"{reps}×makespan {makespan:.1f} s; served in window {served}/{s['requests']} "
                f"({served / t:.2f} req/s), backlog at {t:g} s {s['requests'] - served}"
            )  # fmt: skip
        rt = reps * run.duration_s  # the window's replica-seconds, as the rows' own
        bound = (rt - load_in["qlm"]) / (rt - load_in["qlm-no-warm-start"]) - 1
        print(
            f"{wl:9s} bound on warm start's window-throughput gain (every load second "
            f"removed): {bound:+.1%}; +300 % needs loads ≥ 75 % of the window's replica time"
        )


POINTS: tuple[tuple[str, str, float, float, float, str | None], ...] = (
    # (label, workload, rate, rt share, mega share, profile of both replicas)
    ("W_B 80 req/s", "W_B", 80.0, 0.5, 0.0, None),
    ("W_B 80 req/s, 20 % rt", "W_B", 80.0, 0.2, 0.0, None),
    ("W_B 80 req/s, 80 % rt", "W_B", 80.0, 0.8, 0.0, None),
    ("W_C 10 % mega, 30 req/s", "W_C", 30.0, 0.5, 0.1, None),
    ("Llama-2-70B TP2, 16 req/s", "W_B", 16.0, 0.5, 0.0, "roofline:llama-2-70b@a100-80gbx2"),
)


def eviction(seed: int) -> None:
    from sloserve.experiments.qlm.plan import Run
    from sloserve.experiments.qlm.reproduce import _met, _service_bound

    for label, wl, rate, rt_share, mega, prof in POINTS:
        for system in ("qlm-no-eviction", "qlm", "edf-swap"):
            run = Run(wl, system, rt_share, rate, 40.0, seed, sweep="queue", mega_share=mega)

            def tweak(sim: dict[str, Any], cluster: dict[str, Any], p: str | None = prof) -> None:
                if p is not None:
                    cluster["replicas"] = [{"count": 2, "profile": p}]

            res, at = _run(run, tweak)
            reqs = res.requests
            n = len(reqs)
            miss = [r for r in reqs if not _met(r)]
            unfinished = [r for r in miss if not r.is_finished]
            service = [r for r in miss if _service_bound(r)]
            savable = [r for r in miss if _savable(r, at)]
            rt = [r for r in reqs if r.req_class.value == "rt"]
            waits = [r.first_scheduled - at[r.req_id] for r in rt if r.first_scheduled]
            att = res.summary["deadline_attainment"]
            # any scheduling (order, pull, eviction) saves at most the misses that are
            # neither unfinished nor service-bound; eviction alone only the savable ones
            sched = (len(miss) - len(unfinished) - len(service)) / n
            print(
                f"{label:26s} {system:16s} attainment {att:.3f}; misses {len(miss)}/{n} "
                f"(rt {sum(1 for r in miss if r in rt)}): unfinished {len(unfinished)}, "
                f"service alone past the deadline {len(service)}, savable by eviction "
                f"{len(savable)}; bound: any scheduling +{sched:.3f} (+{sched / att:.1%}), "
                f"eviction +{len(savable) / n:.3f} (+{len(savable) / n / att:.1%}); rt replica "
                f"wait median {_q(waits, 0.5) * 1e3:.0f} ms, p90 {_q(waits, 0.9) * 1e3:.0f} ms; "
                f"mean gap between finishes on a replica {_gap(reqs, 40.0) * 1e3:.0f} ms",
                flush=True,
            )


def _savable(r: Any, at: dict[int, float]) -> bool:
    """Met, had the request not waited on its replica (eviction's most)."""
    if not r.is_finished or r.finish_time is None or r.first_scheduled is None:
        return False
    e2e = r.finish_time - r.arrival - (r.first_scheduled - at[r.req_id])
    return bool(e2e <= float(r.slo.deadline_s) + 1e-9)


def _q(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _gap(reqs: Any, window: float) -> float:
    """Mean time between two finishes on one replica while arrivals last."""
    by: dict[int, list[float]] = {}
    for r in reqs:
        if r.is_finished and r.finish_time is not None and r.finish_time <= window:
            by.setdefault(r.instance_id, []).append(r.finish_time)
    gaps = [b - a for f in by.values() for a, b in zip(sorted(f), sorted(f)[1:], strict=False)]
    return statistics.fmean(gaps) if gaps else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--part", choices=("warm", "eviction", "both"), default="both")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    c0 = time.process_time()
    if args.part in ("warm", "both"):
        warm(args.seed)
    if args.part in ("eviction", "both"):
        eviction(args.seed)
    print(f"CPU {time.process_time() - c0:.1f} s, load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
