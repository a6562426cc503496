"""A simulated cluster run's result: :class:`ClusterRunResult` and how
:func:`~sloserve.experiments.cluster_run.simulate_cluster` assembles it once the run has
ended (:func:`cluster_result`: the request table with the cluster's columns, the summary
with its per-replica rows, costs, holds and attainment by model and class; the trace and
routing decisions as tables).

Kept apart from the run's set-up (``cluster_run.py``): building and running a cluster and
tabulating what it did are two concepts, and each reads in one sitting.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sloserve.cluster.cluster import Cluster
from sloserve.cluster.config import ClusterConfig
from sloserve.core.errors import ConfigError
from sloserve.core.request import Request
from sloserve.costmodel.profile import ReplicaProfile
from sloserve.engine.instance import Instance, InstanceTrace
from sloserve.engine.prefix_stats import prefix_summary
from sloserve.experiments.kv_choice import caching_asked
from sloserve.experiments.lazy_qlm import is_qlm
from sloserve.experiments.runner import RunResult, SimConfig, _BatchFeeder
from sloserve.metrics.run_summary import rates_by, summarize_columns
from sloserve.metrics.summary import request_columns, table_of
from sloserve.workloads.spec import Workload

if TYPE_CHECKING:  # pandas is imported when a table is first read (start-up time)
    import pandas as pd


@dataclass(init=False)
class ClusterRunResult(RunResult):
    """A :class:`RunResult` whose requests may come from several instances."""

    cluster: Cluster | None = field(default=None, repr=False)
    iter_ends: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    """Iteration end times of every instance (incarnation), by instance id."""
    decisions: pd.DataFrame | None = field(default=None, repr=False)
    """Every routing decision (``cluster.trace_decisions``), one row per attempt: the
    request, time, ``considered`` (accepting replicas), ``candidates`` (after the filters),
    ``score_<scorer>`` (normalised, per candidate), ``total``, ``pick`` (-1: held),
    ``hold`` (the reason), ``queue_s`` (time in the global queue so far)."""

    def __init__(
        self,
        config: SimConfig,
        requests: list[Request],
        table: pd.DataFrame | Callable[[], pd.DataFrame],
        summary: dict[str, Any],
        trace: pd.DataFrame | Callable[[], pd.DataFrame],
        iter_end: np.ndarray,
        cluster: Cluster | None = None,
        iter_ends: dict[int, np.ndarray] | None = None,
        decisions: pd.DataFrame | None = None,
    ) -> None:
        super().__init__(config, requests, table, summary, trace, iter_end)
        self.cluster = cluster
        self.iter_ends = {} if iter_ends is None else iter_ends
        self.decisions = decisions

    def timeline(self, req_id: int) -> pd.DataFrame:
        req = next((r for r in self.requests if r.req_id == req_id), None)
        if req is None:
            raise ConfigError(f"no request {req_id} in this run")
        saved = self.iter_end
        try:
            self.iter_end = self.iter_ends.get(req.instance_id, np.empty(0))
            return super().timeline(req_id)
        finally:
            self.iter_end = saved


def _common(values: Sequence[Any]) -> Any:
    return values[0] if values and all(v == values[0] for v in values) else None


def cluster_result(
    cfg: SimConfig,
    ccfg: ClusterConfig,
    clu: Cluster,
    reqs: list[Request],
    sim_s: float,
    workload: Workload,
    feeder: _BatchFeeder | None,
    t0: float,
    gcfgs: Sequence[SimConfig],
    read: Callable[[str], ReplicaProfile],
) -> ClusterRunResult:
    """The result of the ended run on ``clu``: ``reqs`` are the requests that ended,
    ``sim_s`` the simulated time, ``t0`` the run's wall-clock start."""
    incs = [(rep, inst) for rep in clu.replicas for inst in rep.incarnations]
    iter_ends = {inst.instance_id: np.asarray(inst.iter_end, dtype=np.float64) for _, inst in incs}
    replica_of = {inst.instance_id: rep.replica_id for rep, inst in incs}
    cols = request_columns(reqs, {**iter_ends, -1: np.empty(0)})
    if reqs:
        cols["replica"] = [replica_of.get(i, -1) for i in cols["instance"]]
        cols["failovers"] = [r.num_failovers for r in reqs]
        cols["abort_reason"] = [clu.abort_reasons.get(r.req_id, "") for r in reqs]
    # A replica of a TP-n profile holds n GPUs: GPU-seconds are replica-seconds times n,
    # utilisation is busy time over replica-seconds.
    tps: dict[str, int] = {}
    for rep in clu.replicas:
        if rep.spec.profile not in tps:
            tps[rep.spec.profile] = read(rep.spec.profile).tp
    up = [rep.gpu_seconds(sim_s) for rep in clu.replicas]
    gpu = [u * tps[rep.spec.profile] for rep, u in zip(clu.replicas, up, strict=True)]
    prices = [ccfg.replicas[rep.spec.group].gpu_hour_usd for rep in clu.replicas]
    busy = sum(rep.busy_seconds() for rep in clu.replicas)
    insts = [inst for _, inst in incs]
    first = [rep.incarnations[0] for rep in clu.replicas if rep.incarnations]
    policies = list(dict.fromkeys(rep.spec.policy for rep in clu.replicas))
    extra: dict[str, Any] = {
        "iterations": sum(len(i.iter_end) for i in insts),
        "scheduling_decisions": sum(len(i.trace.time) for i in insts),
        "busy_fraction": busy / sum(up) if sum(up) > 0 else None,
        "kv_capacity_tokens": _common([i.limits.kv_capacity_tokens for i in first]),
        "limits": _common([dataclasses.asdict(i.limits) for i in first]),
        "profile": _common([rep.spec.profile for rep in clu.replicas]),
        "predictor": cfg.instance.predictor,
        "policy_params": _common([i.scheduler.describe() for i in first]),
        "seed": cfg.workload.seed,
        "workload_notes": workload.notes
        + ([f"batch jobs stopped: {feeder.stopped}"] if feeder and feeder.stopped else []),
        **prefix_summary(
            [i.kv for i in insts], replicas=[replica_of[i.instance_id] for i in insts], end=sim_s
        ),
        "prefix_caching": caching_asked(
            [i.kv for i in insts],
            [gcfgs[rep.spec.group].instance.prefix_caching for rep, _ in incs],
        ),
    }
    summary = summarize_columns(
        cols,
        simulated_seconds=sim_s,
        wall_seconds=time.perf_counter() - t0,
        policy=policies[0] if len(policies) == 1 else "+".join(policies),
        extra=extra,
    )
    summary["router"] = ccfg.router
    summary["gpu_seconds"] = float(sum(gpu))
    summary["cost_usd"] = (
        float(sum(g / 3600 * p for g, p in zip(gpu, prices, strict=True) if p is not None))
        if all(p is not None for p in prices)
        else None
    )
    summary["replicas"] = [
        {
            "replica": rep.replica_id,
            "profile": rep.spec.profile,
            "policy": rep.spec.policy,
            "model": rep.spec.model,
            "role": rep.spec.role,
            "served": rep.served,
            "handed_off": sum(i.num_handed_off for i in rep.incarnations),
            "utilisation": rep.busy_seconds() / u if u > 0 else None,
            "kv_usage_mean": rep.kv_usage_mean(),
            "preemptions": rep.preemptions(),
            "gpus": tps[rep.spec.profile],
            "gpu_seconds": g,
            "failures": rep.failures,
            "status": rep.status.value,
        }
        for rep, u, g in zip(clu.replicas, up, gpu, strict=True)
    ]
    summary["rejected_by_reason"] = dict(
        sorted(Counter(r.reject_reason for r in reqs if r.reject_reason).items())
    )
    summary["admission"] = ccfg.admission.kind
    summary["model_loads"] = [
        {"replica": rep.replica_id, "start_s": a, "end_s": b, "model": m, "tier": t}
        for rep in clu.replicas
        for a, b, m, t in rep.loads
    ]
    summary["holds"] = dict(sorted(clu.holds.items()))
    summary["aborted_by_reason"] = dict(sorted(Counter(clu.abort_reasons.values()).items()))
    summary["failovers"] = int(sum(r.num_failovers for r in reqs))
    ho = clu.handoff
    summary["kv_transfers"] = len(ho.durations) if ho else 0
    summary["kv_transfer_s_mean"] = float(np.mean(ho.durations)) if ho and ho.durations else None
    summary["kv_transfers_lost"] = ho.lost if ho else 0
    if any(m != "default" for m in cols["model"]):
        ok = np.asarray(cols["slo_ok"], dtype=np.float64)
        summary["slo_attainment_by_model"] = rates_by(cols["model"], ok)
    summary["model_loads_by_tier"] = dict(
        sorted(Counter(t for rep in clu.replicas for *_, t in rep.loads).items())
    )
    if reqs:
        ok = np.asarray(cols["deadline_ok"], dtype=np.float64)
        summary["deadline_attainment_by_class"] = rates_by(cols["class"], ok)
    if is_qlm(clu.router):
        summary["qlm"] = clu.router.summary()
    summary["wall_seconds"] = time.perf_counter() - t0
    iter_end = iter_ends.get(0, np.empty(0))
    return ClusterRunResult(
        cfg,
        reqs,
        functools.partial(table_of, cols),
        summary,
        functools.partial(_trace_table, incs),
        iter_end,
        cluster=clu,
        iter_ends=iter_ends,
        decisions=None if clu.decisions is None else decisions_table(clu.decisions),
    )


def _trace_table(incs: list[tuple[Any, Instance]]) -> pd.DataFrame:
    """Every instance's trace (one row per scheduling decision), ``replica``, ``instance``
    and ``kv_usage`` added, in time order (built when a caller first reads it)."""
    import pandas as pd

    traces = []
    for rep, inst in incs:
        tr = pd.DataFrame(
            {f.name: getattr(inst.trace, f.name) for f in dataclasses.fields(inst.trace)}
        )
        if len(tr):
            tr["kv_usage"] = tr["kv_used_blocks"] / inst.kv.num_blocks
        tr["replica"] = rep.replica_id
        tr["instance"] = inst.instance_id
        traces.append(tr)
    if not traces:  # no replica ever started (every one joins after the run ended)
        cols = [f.name for f in dataclasses.fields(InstanceTrace)]
        traces = [pd.DataFrame({c: [] for c in [*cols, "replica", "instance"]})]
    trace = pd.concat(traces, ignore_index=True) if len(traces) > 1 else traces[0]
    if len(traces) > 1:
        trace = trace.sort_values("time", kind="stable").reset_index(drop=True)
    return trace


def decisions_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The routing records as a table: one ``score_<scorer>`` list column per scorer."""
    import pandas as pd

    names = sorted({n for r in rows for n in r["scores"]})
    flat = []
    for r in rows:
        row = {k: v for k, v in r.items() if k != "scores"}
        for n in names:
            row[f"score_{n}"] = r["scores"].get(n, [])
        flat.append(row)
    cols = ["req_id", "time", "model", "class", "priority", "considered", "candidates"]
    cols += [f"score_{n}" for n in names] + ["total", "pick", "hold", "queue_s"]
    return pd.DataFrame(flat, columns=cols)
