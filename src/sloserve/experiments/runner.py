"""Running simulations: one policy (:func:`simulate`) or several on the same requests
(:func:`compare`). The configs are frozen pydantic models so that a YAML file, CLI flags
and Python code all describe a run the same way, and unknown keys are errors."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sloserve.core.bounds import Count, Fraction, GiB, Seconds, Tokens
from sloserve.core.errors import ConfigError
from sloserve.core.predictor import make_predictor
from sloserve.core.request import Request, RequestStatus
from sloserve.costmodel.base import CostModel, parse_cost_model
from sloserve.costmodel.profile import GIB, ReplicaProfile, load_profile
from sloserve.engine.env import PRIO_ARRIVAL, PRIO_CONTROL, Environment
from sloserve.engine.executor import Executor
from sloserve.engine.instance import Instance
from sloserve.engine.interface import Limits
from sloserve.engine.prefix_stats import prefix_summary
from sloserve.experiments.gc_freeze import frozen, paused, paused_build
from sloserve.experiments.kv_choice import caching_asked, replica_kv
from sloserve.experiments.session_feeder import SessionFeeder
from sloserve.metrics.qoe import consumption_times
from sloserve.metrics.run_summary import summarize_columns
from sloserve.metrics.summary import request_columns, table_of, token_times
from sloserve.policies.registry import make_policy
from sloserve.workloads.arrivals import ConstantArrivals
from sloserve.workloads.batch_jobs import batch_job_requests
from sloserve.workloads.identity import carries_prefix_identity
from sloserve.workloads.spec import (
    BatchJobs,
    Workload,
    WorkloadSpec,
    batch_rng,
    build_workload,
)

if TYPE_CHECKING:  # pandas is imported when a table is first read (start-up time)
    import pandas as pd


class InstanceConfig(BaseModel):
    """One replica: hardware profile and scheduler limits (InferMax's C, P, M, R_max)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: str = Field(
        default="llama-2-7b-a100", description="built-in profile name or YAML path"
    )
    max_running: Count = Field(default=256, description="R_max: requests holding KV at once")
    max_batch_tokens: Tokens = Field(default=4096, description="C: tokens per iteration")
    chunk_size: Tokens | None = Field(default=None, description="P: prefill tokens per iteration")
    block_size: Tokens = Field(default=16, description="KV block size in tokens (1 = exact)")
    kv_utilization: Fraction = Field(default=0.9, description="GPU memory fraction for vLLM")
    kv_capacity_tokens: int | None = Field(
        default=None,
        ge=1,
        # The paged manager keeps a free list of M / block_size entries; 50M tokens is
        # ~50x the largest single-replica KV cache of any catalog pair and still fits memory.
        le=50_000_000,
        description="M override, in tokens (at most 50,000,000)",
    )
    cpu_swap_gib: GiB = Field(default=4.0, description="host memory for swapped KV")
    predictor: str = Field(default="oracle", description="output-length predictor for policies")
    cost_model: str | None = Field(
        default=None, description="'constant:SECONDS' instead of the profile"
    )
    multi_step: bool = Field(default=True, description="advance repeatable decode runs in one step")
    prefix_caching: bool = Field(
        default=True, description="reuse cached KV of identical prompt prefixes (vLLM's APC)"
    )
    cpu_cache_gib: GiB = Field(
        default=0.0, description="host memory for evicted prefix-cache blocks (0: no CPU tier)"
    )

    @field_validator("predictor")
    @classmethod
    def _known_predictor(cls, v: str) -> str:
        make_predictor(v)  # unknown names and bad arguments fail here, before anything runs
        return v

    @field_validator("cost_model")
    @classmethod
    def _known_cost_model(cls, v: str | None) -> str | None:
        if v is not None:
            parse_cost_model(v)
        return v


class SimConfig(BaseModel):
    """A whole simulated run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    instance: InstanceConfig = Field(default_factory=InstanceConfig)
    policy: str = "vllm"
    policy_params: dict[str, Any] = Field(default_factory=dict)
    horizon_s: Seconds | None = Field(default=None, description="abort what is left at this time")


@dataclass(init=False)
class RunResult:
    """Everything one run produced; ``table`` and ``trace`` are data, plots come later.

    Both are pandas DataFrames built on first use: the constructor takes, for each, a
    DataFrame or a picklable function returning one (a module-level function or a
    ``functools.partial`` over plain data), so that a caller that reads only ``summary``
    (``simulate --json``) never builds them, nor imports pandas. Pickling builds both
    (the executor's process and Ray backends pickle results)."""

    config: SimConfig
    requests: list[Request]
    summary: dict[str, Any]
    iter_end: np.ndarray = field(repr=False)

    def __init__(
        self,
        config: SimConfig,
        requests: list[Request],
        table: pd.DataFrame | Callable[[], pd.DataFrame],
        summary: dict[str, Any],
        trace: pd.DataFrame | Callable[[], pd.DataFrame],
        iter_end: np.ndarray,
    ) -> None:
        self.config = config
        self.requests = requests
        self._table = table
        self.summary = summary
        self._trace = trace
        self.iter_end = iter_end

    @property
    def table(self) -> pd.DataFrame:
        """One row per request (:func:`~sloserve.metrics.summary.request_table`)."""
        if callable(self._table):
            self._table = self._table()
        return self._table

    @table.setter
    def table(self, value: pd.DataFrame) -> None:
        self._table = value

    @property
    def trace(self) -> pd.DataFrame:
        """One row per scheduling decision (the instance's trace, ``kv_usage`` added)."""
        if callable(self._trace):
            self._trace = self._trace()
        return self._trace

    @trace.setter
    def trace(self, value: pd.DataFrame) -> None:
        self._trace = value

    def __getstate__(self) -> dict[str, Any]:
        """Both tables built: a builder may hold what does not pickle."""
        state = dict(self.__dict__)
        state["_table"], state["_trace"] = self.table, self.trace
        return state

    def timeline(self, req_id: int) -> pd.DataFrame:
        """One request's token timeline: when each token was delivered, when its user
        consumes it at their reading speed (Andes' pacer), and when they expected it."""
        req = next((r for r in self.requests if r.req_id == req_id), None)
        if req is None:
            raise ConfigError(f"no request {req_id} in this run")
        delivered = token_times(req, self.iter_end)
        import pandas as pd

        out = pd.DataFrame({"token": np.arange(1, delivered.size + 1), "delivered_s": delivered})
        if req.qoe is not None:
            q = req.qoe
            out["consumed_s"] = consumption_times(req.arrival, delivered, q.ttft_s, q.tokens_per_s)
            out["expected_s"] = req.arrival + q.ttft_s + np.arange(delivered.size) / q.tokens_per_s
        return out


def _cost_model(cfg: InstanceConfig, profile: ReplicaProfile) -> CostModel:
    if cfg.cost_model is None:
        return profile.cost_model()
    return parse_cost_model(cfg.cost_model)


def fresh(requests: Sequence[Request]) -> list[Request]:
    """Unserved copies of ``requests`` (so several policies can replay the same ones)."""
    return [
        Request(
            req_id=r.req_id,
            arrival=r.arrival,
            num_prompt_tokens=r.num_prompt_tokens,
            true_output_len=r.true_output_len,
            req_class=r.req_class,
            priority=r.priority,
            model=r.model,
            slo=r.slo,
            qoe=r.qoe,
            max_tokens=r.max_tokens,
            hash_ids=r.hash_ids,
            session_id=r.session_id,
        )
        for r in requests
    ]


def build_instance(
    cfg: SimConfig,
    env: Environment,
    *,
    check_invariants: bool = False,
    instance_id: int = 0,
    profile: ReplicaProfile | None = None,
    executor: Executor | None = None,
    prefix_identities: bool = True,
) -> Instance:
    """The replica of ``cfg``: profile, limits, policy and predictor wired together.

    ``profile`` is ``cfg.instance.profile`` already loaded (a cluster builds many
    instances of one profile: reading its YAML once is enough). ``prefix_identities``
    False: no request this replica can ever see carries a prompt identity, so it gets the
    plain paged manager even with caching on (``experiments/kv_choice.py``: identical
    results, less bookkeeping); only a run that knows all its requests may say so."""
    icfg = cfg.instance
    if profile is None:
        profile = load_profile(icfg.profile)
    policy = make_policy(cfg.policy, cfg.policy_params)
    m_tokens = icfg.kv_capacity_tokens or profile.kv_capacity_tokens(icfg.kv_utilization)
    bs = icfg.block_size
    if m_tokens < bs:
        raise ConfigError(f"KV capacity {m_tokens} tokens is smaller than one block ({bs})")
    c = icfg.max_batch_tokens
    # --chunk-size is P for chunked-prefill policies; without chunking P is the policy's
    # own (C for the Table 1 presets), else a chunk size would cap whole prompts.
    chunk = icfg.chunk_size if policy.chunked_prefill else None
    p = min(chunk or policy.default_prefill_tokens or c, c)
    limits = Limits(
        max_batch_tokens=c,
        max_prefill_tokens=p,
        kv_capacity_tokens=(m_tokens // bs) * bs,
        max_running=icfg.max_running,
        block_size=bs,
    )
    cpu_blocks = int(icfg.cpu_swap_gib * GIB // (profile.kv_bytes_per_token * bs))
    kv = replica_kv(
        policy.make_kv(limits, cpu_blocks),  # a policy's own manager (BROS) opts out
        caching=icfg.prefix_caching,
        prefix_identities=prefix_identities,
        num_blocks=limits.kv_capacity_tokens // bs,
        block_size=bs,
        cpu_blocks=cpu_blocks,
        cpu_cache_blocks=int(icfg.cpu_cache_gib * GIB // (profile.kv_bytes_per_token * bs)),
    )
    return Instance(
        env,
        policy,
        _cost_model(icfg, profile),
        limits,
        make_predictor(icfg.predictor),
        kv=kv,
        cpu_swap_blocks=cpu_blocks,
        max_context=profile.model.max_context,
        multi_step=icfg.multi_step,
        check_invariants=check_invariants,
        instance_id=instance_id,
        executor=executor,
    )


def workload_of(cfg: SimConfig, profile: ReplicaProfile | None = None) -> Workload:
    """The workload ``cfg`` describes (sampled lengths clipped to the model's context);
    ``profile``: ``cfg.instance.profile`` already loaded (one YAML read per run)."""
    if profile is None:
        profile = load_profile(cfg.instance.profile)
    with paused():  # the requests live until the run ends: no collector passes over them
        return build_workload(cfg.workload, max_context=profile.model.max_context)


def workload_requests(cfg: SimConfig) -> list[Request]:
    """The open-loop requests ``cfg`` describes."""
    return workload_of(cfg).requests


def schedule_arrivals(env: Environment, requests: Sequence[Request], sink: RequestSink) -> None:
    """Hand ``requests`` (sorted by arrival) to ``sink`` at their arrival times.

    One pending arrival event at a time, each scheduling the next, so the heap never holds
    the whole trace; a replica and a cluster see the very same event sequence."""
    feed: Iterator[Request] = iter(requests)

    def arrive(r: Request) -> None:
        sink.add_request(r)
        nxt = next(feed, None)
        if nxt is not None:
            env.schedule(nxt.arrival, lambda: arrive(nxt), PRIO_ARRIVAL)

    first = next(feed, None)
    if first is not None:
        env.schedule(first.arrival, lambda: arrive(first), PRIO_ARRIVAL)


@paused_build  # the collector on only while the run runs (experiments/gc_freeze.py)
def simulate(
    cfg: SimConfig,
    requests: Sequence[Request] | Workload | None = None,
    *,
    check_invariants: bool = False,
    executor: Executor | None = None,
) -> RunResult:
    """Run one policy on one replica until every request ends (or ``horizon_s``).

    ``executor`` runs each iteration instead of the profile's cost model (execute mode);
    the clock then advances by what it reports (measured wall time).

    ``requests`` (a list or a :class:`Workload`) replays those requests instead of building
    the config's workload; closed-loop batch jobs come from the workload (or the config).
    """
    t0 = time.perf_counter()
    profile = load_profile(cfg.instance.profile)  # read once: the workload and the replica
    if isinstance(requests, Workload):
        workload = requests
    elif requests is not None:
        workload = Workload(list(requests), [], cfg.workload.batch_jobs)
    else:
        workload = workload_of(cfg, profile)
    # Requests built here are this run's own: only a caller's need copying.
    reqs = fresh(workload.requests) if requests is not None else list(workload.requests)
    env = Environment()
    inst = build_instance(
        cfg,
        env,
        check_invariants=check_invariants,
        executor=executor,
        profile=profile,
        prefix_identities=carries_prefix_identity(reqs, workload.sessions),
    )
    feeder = (
        _BatchFeeder(cfg, workload.batch_jobs, env, inst, reqs) if workload.batch_jobs else None
    )
    turns = SessionFeeder(workload.sessions, env, inst)  # closed-loop session turns
    schedule_arrivals(env, reqs, inst)
    horizon = cfg.horizon_s if cfg.horizon_s is not None else math.inf
    if horizon != math.inf:
        # An event at the horizon, so that no fast-forwarded run of iterations crosses it.
        env.schedule(horizon, lambda: None, PRIO_CONTROL)
    with frozen():  # the run's long-lived objects out of the collector's passes
        env.run(until=horizon)
    aborted = inst.num_live > 0 or inst.busy
    if aborted:
        inst.abort_all()
    # The run ends with its last event: the horizon if work was left, else the last finish.
    sim_s = horizon if aborted else max([r.finish_time or 0.0 for r in inst.done] + [0.0])
    iter_end = np.asarray(inst.iter_end, dtype=np.float64)
    if feeder is not None:
        reqs = reqs + feeder.submitted
    # Requests whose arrival lies beyond the horizon never reached the replica.
    reqs = [r for r in reqs + turns.submitted if r.instance_id >= 0]
    cols = request_columns(reqs, {inst.instance_id: iter_end})
    wall = time.perf_counter() - t0
    summary = summarize_columns(
        cols,
        simulated_seconds=sim_s,
        wall_seconds=wall,
        policy=cfg.policy,
        extra={
            "iterations": len(inst.iter_end),
            "scheduling_decisions": len(inst.trace.time),
            "busy_fraction": inst.busy_time / sim_s if sim_s > 0 else None,
            "kv_capacity_tokens": inst.limits.kv_capacity_tokens,
            "limits": dataclasses.asdict(inst.limits),
            "profile": cfg.instance.profile,
            "predictor": cfg.instance.predictor,
            "policy_params": inst.scheduler.describe(),
            "seed": cfg.workload.seed,
            "workload_notes": workload.notes
            + ([f"batch jobs stopped: {feeder.stopped}"] if feeder and feeder.stopped else []),
            **prefix_summary([inst.kv], end=sim_s),
            "prefix_caching": caching_asked([inst.kv], [cfg.instance.prefix_caching]),
        },
    )
    summary["wall_seconds"] = time.perf_counter() - t0
    return RunResult(
        cfg, reqs, functools.partial(table_of, cols), summary, _trace_of(inst), iter_end
    )


def _trace_of(inst: Instance) -> Callable[[], pd.DataFrame]:
    """What builds ``inst``'s trace table (one row per scheduling decision) when read: a
    partial over the trace's columns and the block count, not the instance (which it would
    keep alive, and which does not pickle)."""
    cols = {f.name: getattr(inst.trace, f.name) for f in dataclasses.fields(inst.trace)}
    return functools.partial(_trace_table, cols, inst.kv.num_blocks)


def _trace_table(cols: dict[str, list[Any]], num_blocks: int) -> pd.DataFrame:
    """The trace table of an instance trace's columns, ``kv_usage`` added."""
    import pandas as pd

    trace = pd.DataFrame(cols)
    if len(trace):
        trace["kv_usage"] = trace["kv_used_blocks"] / num_blocks
    return trace


class RequestSink(Protocol):
    """Where batch jobs submit requests: one instance, or a cluster."""

    on_done: Callable[[Request], None] | None

    def add_request(self, req: Request) -> None: ...


class _BatchFeeder:
    """Closed-loop batch jobs: the next batch arrives when the previous one has completed.

    ``submitted`` is a list the feeder keeps appending to, so that the run's request table
    includes every batch request it created.
    """

    def __init__(
        self,
        cfg: SimConfig,
        jobs: BatchJobs,
        env: Environment,
        inst: RequestSink,
        open_loop: list[Request],
    ) -> None:
        self.cfg = cfg
        self.jobs = jobs
        self.env = env
        self.inst = inst
        self.rng = batch_rng(cfg.workload.seed)
        self.next_id = max((r.req_id for r in open_loop), default=-1) + 1
        self.outstanding: set[int] = set()
        self.served = 0
        self.stopped = ""
        self.batches = 0
        self.submitted: list[Request] = []
        self.context = load_profile(cfg.instance.profile).model.max_context
        previous = inst.on_done

        def on_done(r: Request) -> None:
            if previous is not None:
                previous(r)
            if r.req_id in self.outstanding:
                self.outstanding.discard(r.req_id)
                if r.status is RequestStatus.FINISHED:
                    self.served += 1
                if not self.outstanding:
                    if self.served == 0:
                        # nothing of this batch could be served: the next would fare the
                        # same, and resubmitting at once would never let time advance
                        self.stopped = f"batch {self.batches} had no servable request"
                        return
                    self._schedule(self.env.now + self.jobs.gap_s)

        inst.on_done = on_done
        self._schedule(jobs.start_s)

    def _more(self, at: float) -> bool:
        # Like open-loop arrivals with num_requests and duration_s: whichever ends first.
        # (num_batches alone once ran past the window: a huge count never ended.)
        n = self.jobs.num_batches
        if n is not None and self.batches >= n:
            return False
        d = self.cfg.workload.duration_s
        return d is None or at < d

    def _schedule(self, at: float) -> None:
        if not self._more(at):
            return
        batch = batch_job_requests(
            self.jobs,
            self.cfg.workload,
            self.rng,
            first_id=self.next_id,
            at=at,
            max_context=self.context,
        )
        self.batches += 1
        self.next_id += len(batch)
        self.outstanding = {r.req_id for r in batch}
        self.served = 0
        self.submitted.extend(batch)
        for r in batch:
            self.env.schedule(at, functools.partial(self.inst.add_request, r), PRIO_ARRIVAL)


def check_policies(cfg: SimConfig, policies: Sequence[str]) -> None:
    """Fail before running anything: no policy, one listed twice, or an unknown one (the
    config's ``policy_params`` apply to every policy)."""
    if not policies:
        raise ConfigError("compare needs at least one policy")
    dup = {p for p in policies if list(policies).count(p) > 1}
    if dup:
        raise ConfigError(f"policy listed twice: {', '.join(sorted(dup))}")
    for p in policies:
        make_policy(p, cfg.policy_params)


def compare(cfg: SimConfig, policies: Sequence[str]) -> dict[str, RunResult]:
    """Run each policy on the very same requests."""
    check_policies(cfg, policies)
    workload = workload_of(cfg)
    return {p: simulate(cfg.model_copy(update={"policy": p}), workload) for p in policies}


def saturation_throughput(
    mix: str, profile: str, *, n: int = 400, seed: int = 0, max_running: int = 256
) -> float:
    """Requests/s that vLLM completes on ``profile`` when ``n`` requests of ``mix`` are all
    queued at once: the replica's capacity, which the reproductions scale their loads by."""
    cfg = SimConfig(
        workload=WorkloadSpec(
            mix=mix,
            arrival=ConstantArrivals(rate=1e6),
            num_requests=n,
            duration_s=None,
            seed=seed,
        ),
        instance=InstanceConfig(profile=profile, max_running=max_running),
        policy="vllm",
    )
    s = simulate(cfg).summary
    return float(s["finished"] / s["simulated_seconds"])
