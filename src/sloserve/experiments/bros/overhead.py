"""BROS' scheduling overhead (§7.4.2, Figure 14): wall-clock time spent inside a policy's
``schedule()`` per iteration, against the simulated duration of that iteration, with
requests queued at t = 0 (half RT, half one BE batch).

Choice where the paper is vague:

* **Overhead.** ``schedule()`` is timed with ``time.perf_counter`` around each call (one
  call per iteration: the multi-step fast path is off), over the first
  ``overhead_iterations`` iterations. The simulator's Python policy against a simulated GPU
  is not the paper's system (Python scheduler against a real GPU), so the fraction is an
  order-of-magnitude comparison, and wall-clock times depend on the machine's load.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from typing import Any

import numpy as np

from sloserve.core.bounds import MAX_RATE
from sloserve.core.errors import ConfigError, SloserveError
from sloserve.experiments.bros.plan import RunFailed
from sloserve.experiments.runner import InstanceConfig, SimConfig, build_instance
from sloserve.workloads import ConstantArrivals, WorkloadSpec
from sloserve.workloads.spec import BatchJobs


def overhead_config(policy: str, profile: str, queued: int, seed: int) -> SimConfig:
    """The overhead benchmark's replica: one ``schedule()`` per iteration (no fast path)."""
    return SimConfig(
        workload=WorkloadSpec(
            mix="sharegpt",
            arrival=ConstantArrivals(rate=MAX_RATE),  # all queued at once (1 µs apart)
            num_requests=max(1, queued - queued // 2),
            duration_s=None,
            seed=seed,
            batch_jobs=BatchJobs(batch_size=max(1, queued // 2), num_batches=1),
        ),
        instance=InstanceConfig(profile=profile, multi_step=False),
        policy=policy,
    )


def measure_overhead(
    policy: str, *, profile: str = "llama-2-7b-a100", queued: int = 100, iterations: int = 200,
    seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Time ``schedule()`` over the first ``iterations`` iterations with ``queued`` requests
    (half RT from ShareGPT, half one BE batch) all arriving at t = 0."""
    from sloserve.engine.env import PRIO_ARRIVAL, Environment
    from sloserve.experiments.runner import workload_of
    from sloserve.workloads.batch_jobs import batch_job_requests
    from sloserve.workloads.spec import batch_rng

    cfg = overhead_config(policy, profile, queued, seed)
    wl = workload_of(cfg)
    jobs = cfg.workload.batch_jobs
    assert jobs is not None
    be = batch_job_requests(
        jobs,
        cfg.workload,
        batch_rng(seed),
        first_id=len(wl.requests),
        at=0.0,
        max_context=None,
    )
    env = Environment()
    inst = build_instance(cfg, env)
    sched = inst.scheduler
    # One schedule() per iteration is what is timed: no decision taken on the policy's
    # promise without the call (engine/decode_run.py; the chunk runs need multi_step).
    sched.repeats_decode_run = False
    inner = sched.schedule
    spent: list[float] = []

    def timed(view: Any) -> Any:
        t = time.perf_counter()
        out = inner(view)
        spent.append(time.perf_counter() - t)
        return out

    # an instance attribute shadows the method: the engine calls scheduler.schedule(view)
    setattr(sched, "schedule", timed)  # noqa: B010
    for r in [*wl.requests, *be]:
        env.schedule(r.arrival, functools.partial(inst.add_request, r), PRIO_ARRIVAL)
    while len(inst.iter_end) < iterations and env.peek() != math.inf:
        env.step()
    ends = np.asarray(inst.iter_end[:iterations], dtype=np.float64)
    n = ends.size
    if n == 0:
        raise ConfigError(f"overhead benchmark: policy {policy!r} ran no iteration")
    iter_s = np.diff(np.concatenate([[0.0], ends]))
    sched_s = np.asarray(spent[:n], dtype=np.float64)
    return {
        "policy": policy,
        "profile": profile,
        "queued": queued,
        "iterations": int(n),
        "schedule_ms_mean": float(sched_s.mean() * 1e3),
        "schedule_ms_median": float(statistics.median(sched_s) * 1e3),
        "iteration_ms_mean": float(iter_s.mean() * 1e3),
        "schedule_to_iteration": float(sched_s.mean() / iter_s.mean()),
        # per-iteration fraction as the paper's Figure 14: scheduling / (scheduling + execution)
        "overhead_fraction": float(np.mean(sched_s / (sched_s + iter_s))),
    }


def _overhead_job(args: tuple[str, str, int, int, int]) -> dict[str, Any]:
    policy, profile, queued, iterations, seed = args
    try:
        return measure_overhead(
            policy, profile=profile, queued=queued, iterations=iterations, seed=seed
        )
    except SloserveError as e:
        raise RunFailed(
            f"overhead {policy} with {queued} queued: {type(e).__name__}: {e}"
        ) from None
