"""QLM's reproduction (§8 of ``papers/qlm.txt``): run the plan, tabulate, and put the
headline numbers beside the paper's.

Headlines (choices; ``headline.py`` has the details): *attainment gain* is QLM's
e2e-deadline attainment over the best baseline's (the mean over the latency-sensitive
shares), as a relative change; *throughput gain* likewise with requests finished in the
arrival window per second (and output tokens ÷ the time to the last finish beside it);
*warm start* is QLM vs QLM without the warm-start LSO on W_A (throughput); *eviction* is
QLM vs QLM without eviction on W_B (attainment). The
plan-generator time curve times :func:`~sloserve.cluster.qlm.generate_plan` on synthetic
queues (groups of 64 requests, 32 instances, 8 models), the RCT accuracy is the R² of the
estimated vs simulated completion times of QLM's runs. Everything but wall-clock times is
deterministic for a seed.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sloserve.cluster.qlm import PlanGroup, PlannerConfig, PlanQueue, generate_plan
from sloserve.experiments.qlm.headline import headline
from sloserve.experiments.qlm.plan import MEGA_PROMPT, Plan, Run, tail_model
from sloserve.experiments.report import jsonable


@dataclass
class Reproduction:
    """The rows of every run, the plan-time curve and the headline numbers."""

    results: pd.DataFrame
    plan_times: pd.DataFrame
    headline: dict[str, Any]


def run_one(run: Run) -> dict[str, Any]:
    """Simulate one run and return its row."""
    from sloserve.cluster.config import ClusterConfig
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.runner import SimConfig

    sim, cluster = run.config()
    cfg = SimConfig.model_validate(sim)
    res = simulate_cluster(
        cfg, ClusterConfig.load(cluster, f"qlm run {run.key}"), _workload(cfg, run)
    )
    s = res.summary
    # Throughput while arrivals last (the queue stands): the summary's divides by the time
    # to the last finish, which the slowest request sets once every system drains its queue.
    in_window = served_in_window(res.requests, run.duration_s)
    tail = tail_model(run.workload)
    t_win = run.duration_s
    loads = s.get("model_loads") or []
    q = s.get("qlm") or {}
    by_class = s.get("deadline_attainment_by_class") or {}
    return {
        "workload": run.workload,
        "system": run.system,
        "rt_share": run.rt_share,
        "group_size_factor": run.group_size_factor,
        "arrival_cv": run.arrival_cv,
        "sweep": run.sweep,
        "seed": run.seed,
        "rate": run.rate,
        "tail_share": run.tail_share,
        "a10_share": run.a10_share,
        "mega_share": run.mega_share,
        "requests": s["requests"],
        "finished": s["finished"],
        "attainment": s["deadline_attainment"],
        "attainment_rt": by_class.get("rt"),
        "attainment_be": by_class.get("be"),
        "throughput_tokens_per_s": s["throughput_tokens_per_s"],
        "window_tokens_per_s": sum(r.num_output_tokens for r in in_window) / run.duration_s,
        "window_requests_per_s": len(in_window) / run.duration_s,
        # the window is the arrival window [0, duration_s]; requests not finished at its
        # end: a positive backlog means the window's rate is a served rate, not the offer
        "window_s": t_win,
        "window_backlog": s["requests"] - len(in_window),
        # the tail model's requests, offered and served in the window: a window gain that
        # serves none of them counts work put off, not work done faster (H1)
        "tail_requests": sum(1 for r in res.requests if r.model == tail),
        "window_tail_served": sum(1 for r in in_window if r.model == tail),
        # model-load seconds summed over replicas, in all and inside the window (what a
        # free warm start could give back: the bound in benchmarks/qlm_limits.py)
        "model_load_s": sum(ld["end_s"] - ld["start_s"] for ld in loads),
        "model_load_s_window": sum(
            max(0.0, min(ld["end_s"], t_win) - ld["start_s"]) for ld in loads
        ),
        "replicas": len(s.get("replicas") or []),
        **miss_counts(res.requests),
        "model_loads_cold": (s.get("model_loads_by_tier") or {}).get("disk", 0),
        "model_loads_warm": (s.get("model_loads_by_tier") or {}).get("cpu", 0),
        # waited for the rest of a warm-start read under way, then loaded from CPU memory
        "model_loads_read": (s.get("model_loads_by_tier") or {}).get("read", 0),
        "preemptions": s["preemptions"],
        "swaps": s["swaps"],
        "plan_calls": q.get("plan_calls", 0),
        "plan_fallbacks": q.get("plan_fallbacks", 0),
        "plan_solve_s": q.get("plan_solve_s_total", 0.0),
        "rct_r2": q.get("rct_r2"),
        "rct_wait_r2": q.get("rct_wait_r2"),
        "wall_s": s["wall_seconds"],
    }


def _deadline(r: Any) -> float | None:
    return None if r.slo.deadline_s is None else float(r.slo.deadline_s)


def _met(r: Any) -> bool:
    """The request met its end-to-end deadline (no deadline: met)."""
    d = _deadline(r)
    if d is None:
        return True
    if not r.is_finished or r.finish_time is None:  # aborted at the horizon: missed
        return False
    return bool(r.finish_time - r.arrival <= d + 1e-9)


def _service_bound(r: Any) -> bool:
    d = _deadline(r)
    if d is None or not r.is_finished or r.finish_time is None or r.first_scheduled is None:
        return False
    return bool(r.finish_time - r.first_scheduled > d + 1e-9)


def served_in_window(requests: Any, t: float) -> list[Any]:
    """The requests served in the window ``[0, t]``: finished (a rejected or aborted request
    has a finish time too) by ``t``."""
    return [
        r for r in requests if r.is_finished and r.finish_time is not None and r.finish_time <= t
    ]


def miss_counts(requests: Any) -> dict[str, int]:
    """``deadline_misses`` and ``misses_service_bound``: the late ones whose service alone
    (first scheduled -> finish) already exceeded the deadline, which no ordering, pull or
    eviction could have saved."""
    return {
        "deadline_misses": sum(1 for r in requests if not _met(r)),
        "misses_service_bound": sum(1 for r in requests if _service_bound(r)),
    }


def _workload(cfg: Any, run: Run) -> Any:
    """The run's requests: the workload's, with W_C's mega-prompts drawn in (a seeded
    choice of ``mega_share`` of them); ``None`` (the simulator builds them) otherwise."""
    if run.mega_share <= 0:
        return None
    from sloserve.experiments.runner import workload_of

    wl = workload_of(cfg)
    rng = random.Random(run.seed + 7919)
    n = round(run.mega_share * len(wl.requests))
    prompt, output = MEGA_PROMPT
    for r in rng.sample(wl.requests, n):
        r.num_prompt_tokens, r.true_output_len, r.max_tokens = prompt, output, None
    return wl


def plan_time_curve(sizes: tuple[int, ...], seed: int) -> pd.DataFrame:
    """Plan-generator time vs queue size (groups of 64 requests, 32 queues, 8 models)."""
    import scipy.optimize  # noqa: F401  (its one-time import is not solve time)

    rng = random.Random(seed)
    rows = []
    for n in sizes:
        n_q = min(32, max(2, n // 4))
        groups = [
            PlanGroup(
                i,
                f"m{rng.randrange(8)}",
                rng.uniform(5, 600),
                tuple(rng.uniform(1, 4) for _ in range(n_q)),
                tuple(rng.uniform(2, 6) for _ in range(n_q)),
            )
            for i in range(n)
        ]
        queues = [PlanQueue(k, f"m{k % 8}", rng.uniform(0, 2), 3.0) for k in range(n_q)]
        t0 = time.perf_counter()
        plan = generate_plan(groups, queues, PlannerConfig())
        dt = time.perf_counter() - t0
        rows.append(
            {
                "groups": n,
                "requests": n * 64,
                "queues": n_q,
                "method": plan.method,
                "solve_s": dt,
                "us_per_request": dt / (n * 64) * 1e6,
            }
        )
    return pd.DataFrame(rows)


def reproduce(
    plan: Plan, out: Path, progress: Callable[[int, int], None] | None = None
) -> Reproduction:
    """Run ``plan`` and write ``results.csv``, ``plan_times.csv``, ``headline.json`` and
    the figures into ``out``."""
    from sloserve.experiments.qlm.figures import plot

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for k, run in enumerate(plan.runs):
        rows.append(run_one(run))
        if progress is not None:
            progress(k + 1, len(plan.runs))
    results = pd.DataFrame(rows)
    times = plan_time_curve(plan.plan_sizes, plan.seed)
    head = headline(results, times, plan)
    results.to_csv(out / "results.csv", index=False)
    times.to_csv(out / "plan_times.csv", index=False)
    (out / "headline.json").write_text(json.dumps(jsonable(head), indent=2))
    plot(results, times, out)
    return Reproduction(results, times, head)
