"""One simulation of the capacity search: an arm with ``n`` replicas at a rate and seed,
judged against the targets (:func:`run_probe`, the executor's task).

A probe is plain data in and out (any executor can ship it). It runs the cluster with a
:class:`~sloserve.experiments.capacity.slo.MissWatch` when early stopping is on, and
always measures what the explanation needs: where the time to the first token went
(queueing vs prefill), TPOT, preemptions and KV usage — over the whole run, or up to the
point a stopped run was stopped.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sloserve.core.request import Request, RequestStatus
from sloserve.experiments.capacity.slo import MissWatch, Target, certain_misses, verdict
from sloserve.experiments.capacity.space import Arm, groups, load_point, with_rate

if TYPE_CHECKING:
    from sloserve.experiments.runner import SimConfig
    from sloserve.workloads.spec import Workload


@dataclass(frozen=True)
class Probe:
    """What one simulation needs: the base run config (a mapping), the arm, the point."""

    base: dict[str, Any]
    arm: Arm
    replicas: int
    rate: float
    seed: int
    targets: tuple[Target, ...]
    attainment: float
    native_rate: float | None = None
    prices: tuple[tuple[str, float | None], ...] = ()
    router_params: tuple[tuple[str, Any], ...] = ()
    early_stop: bool = True
    watch_every_s: float = 5.0
    cluster: dict[str, Any] | None = None
    """A fixed cluster (a ``cluster:`` mapping) instead of the arm's groups: the router is
    the arm's, the replicas and profiles the mapping's (the max-rate question)."""

    def config(self) -> tuple[Any, Any]:
        """The validated (SimConfig, ClusterConfig) of this point."""
        data = with_rate(self.base, self.rate, self.native_rate)
        data["policy"] = self.arm.policy
        data["workload"]["seed"] = self.seed
        if self.cluster is not None:
            fixed = {**self.cluster, "router": self.arm.router}
            if self.cluster.get("router") != self.arm.router:
                fixed.pop("router_params", None)  # they were the config's router's
            data["cluster"] = fixed
            return load_point(data)
        data.setdefault("instance", {})["profile"] = self.arm.profiles[0]
        data["cluster"] = {
            "replicas": groups(self.arm, self.replicas, dict(self.prices)),
            "router": self.arm.router,
            "router_params": dict(self.router_params),
        }
        return load_point(data)


@dataclass
class ProbeResult:
    """A probe's verdict and measurements (plain data)."""

    arm: Arm
    replicas: int
    rate: float
    seed: int
    passes: bool
    attainment: float
    """Of the whole run; an upper bound when ``stopped_at_s`` is set."""
    stopped_at_s: float | None
    requests: int
    realised_rate: float
    gpus: int
    gpu_seconds: float
    cost_usd: float | None
    output_tokens: int
    wall_s: float
    shares: dict[str, float] = field(default_factory=dict)
    explain: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] | None = None
    chunked_prefill: bool | None = None
    load_ratio: float = 1.0
    """Tokens offered over tokens served by the end of the run (> 1: the replicas fell
    behind, by about that factor; see :func:`load_ratio`)."""

    @property
    def cost_per_mtok(self) -> float | None:
        if self.cost_usd is None or self.output_tokens <= 0:
            return None
        return self.cost_usd / self.output_tokens * 1e6


def _explain(reqs: Sequence[Request], now: float, targets: Sequence[Target]) -> dict[str, Any]:
    """Where the missed requests lost their time (queue vs prefill share of TTFT, TPOT)."""
    from sloserve.experiments.capacity.slo import _bounds

    arrived = [r for r in reqs if r.arrival <= now]
    missed = [r for r in arrived if (b := _bounds(r, targets)) and certain_misses(r, now, b)]
    queue, prefill, tpots = [], [], []
    for r in missed:
        if r.first_token_time is None or r.first_scheduled is None:
            if r.status not in (RequestStatus.REJECTED, RequestStatus.ABORTED):
                queue.append(now - r.arrival)  # still waiting: all of it is queueing
                prefill.append(0.0)
            continue
        queue.append(r.first_scheduled - r.arrival)
        prefill.append(r.first_token_time - r.first_scheduled)
        end = r.finish_time
        if end is not None and r.num_output_tokens > 1:
            tpots.append((end - r.first_token_time) / (r.num_output_tokens - 1))
    q, p = float(np.sum(queue)), float(np.sum(prefill))
    kinds: dict[str, int] = {}
    for r in missed:
        for m in certain_misses(r, now, _bounds(r, targets)):
            kinds[m] = kinds.get(m, 0) + 1
    return {
        "missed": len(missed),
        "arrived": len(arrived),
        "missed_by": dict(sorted(kinds.items())),
        "ttft_queue_share": q / (q + p) if q + p > 0 else None,
        "ttft_prefill_share": p / (q + p) if q + p > 0 else None,
        "missed_ttft_mean_s": float(np.mean(np.add(queue, prefill))) if queue else None,
        "missed_tpot_mean_s": float(np.mean(tpots)) if tpots else None,
        "rejected": sum(1 for r in arrived if r.status is RequestStatus.REJECTED),
        "preemptions_per_request": (
            float(np.mean([r.num_preemptions for r in arrived])) if arrived else 0.0
        ),
    }


def load_ratio(reqs: Sequence[Request], now: float) -> float:
    """Prompt and output tokens of the requests arrived by ``now`` over the tokens the
    replicas processed for them. A saturated cluster falls behind at a steady rate, so
    this is about the factor by which its capacity must grow (a lower bound on the
    replicas needed: the SLO may need more); about 1 when it keeps up. Capped at 16."""
    offered = served = 0
    for r in reqs:
        if r.arrival > now:
            break  # in arrival order
        offered += r.num_prompt_tokens + r.true_output_len
        if r.status is RequestStatus.FINISHED:
            served += r.num_prompt_tokens + r.true_output_len
        elif r.status not in (RequestStatus.REJECTED, RequestStatus.ABORTED):
            served += min(r.num_computed_tokens, r.num_prompt_tokens) + r.num_output_tokens
        else:
            offered -= r.num_prompt_tokens + r.true_output_len  # never to be served
    if served <= 0:
        return 1.0  # nothing to measure a rate by yet
    # at most 16×: a short, bursty start must not send the search to the far end
    return min(offered / served, 16.0)


@functools.lru_cache(maxsize=8)
def _built(spec_json: str, max_context: int) -> Workload:
    from sloserve.workloads.spec import WorkloadSpec, build_workload

    return build_workload(WorkloadSpec.model_validate_json(spec_json), max_context=max_context)


def _workload(cfg: SimConfig) -> Workload | None:
    """The probe's workload, built once per worker process for each distinct workload
    (a search simulates the same arrivals at many replica counts; reading and scaling
    the trace was a tenth of a short probe). None (build it in the run): a closed loop,
    whose requests depend on the run."""
    from sloserve.costmodel.profile import load_profile

    if cfg.workload.batch_jobs:
        return None
    spec = cfg.workload.model_dump_json()
    w = _built(spec, load_profile(cfg.instance.profile).model.max_context)
    if getattr(w, "sessions", None) is not None:
        return None
    return w  # simulate_cluster replays copies of its requests (runner.fresh)


def run_probe(p: Probe) -> ProbeResult:
    """Simulate the probe's point and judge it (the capacity search's executor task)."""
    from sloserve.costmodel.profile import load_profile
    from sloserve.experiments.cluster_run import StoppedEarly, simulate_cluster

    t0 = time.perf_counter()
    cfg, ccfg = p.config()
    watch = MissWatch(p.targets, p.attainment, p.watch_every_s) if p.early_stop else None
    gpus = sum(g.count * load_profile(g.profile or cfg.instance.profile).tp for g in ccfg.replicas)
    duration = cfg.workload.duration_s or 0.0
    try:
        res = simulate_cluster(cfg, ccfg, _workload(cfg), watch=watch)
    except StoppedEarly as stop:
        reqs = stop.requests
        n = watch.counted if watch is not None else 0
        misses = watch.misses if watch is not None else 0
        reps = stop.cluster.replicas
        kv = [u for rep in reps if (u := rep.kv_usage_mean()) is not None]
        explain = _explain(reqs, stop.at_s, p.targets)
        explain["kv_usage_mean"] = float(np.mean(kv)) if kv else None
        explain["preemptions"] = int(sum(rep.preemptions() for rep in reps))
        return ProbeResult(
            p.arm,
            p.replicas,
            p.rate,
            p.seed,
            passes=False,
            attainment=(n - misses) / n if n else 0.0,
            stopped_at_s=stop.at_s,
            requests=len(reqs),
            realised_rate=len(reqs) / duration if duration else p.rate,
            gpus=gpus,
            gpu_seconds=float("nan"),
            cost_usd=None,
            output_tokens=0,
            wall_s=time.perf_counter() - t0,
            explain=explain,
            load_ratio=load_ratio(reqs, stop.at_s),
        )
    v = verdict(res.table, p.targets, p.attainment)
    s = res.summary
    reqs = res.requests
    end = max([r.finish_time or 0.0 for r in reqs] + [0.0])
    explain = _explain(reqs, end, p.targets)
    kv = [u for rep in s["replicas"] if (u := rep["kv_usage_mean"]) is not None]
    explain["kv_usage_mean"] = float(np.mean(kv)) if kv else None
    explain["preemptions"] = int(sum(rep["preemptions"] for rep in s["replicas"]))
    clu = res.cluster
    first = clu.replicas[0].incarnations[0] if clu and clu.replicas[0].incarnations else None
    return ProbeResult(
        p.arm,
        p.replicas,
        p.rate,
        p.seed,
        passes=v.passes,
        attainment=v.attainment,
        stopped_at_s=None,
        requests=len(res.table),
        realised_rate=len(res.table) / duration if duration else p.rate,
        gpus=gpus,
        gpu_seconds=float(s["gpu_seconds"]),
        cost_usd=s.get("cost_usd"),
        output_tokens=int(res.table["generated_tokens"].sum()) if len(res.table) else 0,
        wall_s=time.perf_counter() - t0,
        shares=v.shares,
        explain=explain,
        limits=s.get("limits"),
        chunked_prefill=None if first is None else bool(first.scheduler.chunked_prefill),
    )
