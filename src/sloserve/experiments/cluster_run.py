"""Simulated runs of a cluster: :func:`simulate_cluster` (the run's config plus a
:class:`~sloserve.cluster.config.ClusterConfig`).

A separate entry point rather than a ``cluster`` field on ``SimConfig``: the single-replica
path (``runner.simulate``), its config schema and its summaries stay exactly as they are,
and the CLI can map ``--replicas N --router X`` or a YAML ``cluster:`` section onto a
``ClusterConfig`` and call this. A one-replica cluster with the ``pass-through`` router
gives the single-replica run's table, trace and summary (plus the cluster's own columns
and keys: the events are the same, in the same order).

Choices: a group's unset policy parameters are the run's ``policy_params`` when the group
runs the run's policy, else none. The router's seed is ``router_params.seed`` if given,
else the workload's seed. The summary's single-replica keys describe the whole cluster:
``iterations`` and ``scheduling_decisions`` are sums, ``busy_fraction`` is busy time over
GPU-seconds; ``profile``, ``limits``, ``kv_capacity_tokens`` and ``policy_params`` are the
replicas' common value (``None`` when they differ: see ``replicas``).

**Early stopping** (for searches that only need a verdict): ``watch`` is a
:class:`RunWatch` asked every ``watch.every_s`` simulated seconds; when it answers True the
run raises :class:`StoppedEarly` instead of returning (the requests are its evidence).
Watch events are control events: they do not change the run's result.

The result (:class:`ClusterRunResult`, its table, summary and traces) is assembled in
``experiments/cluster_result.py``; both names are importable from here too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from sloserve.cluster.cluster import Cluster
from sloserve.cluster.config import ClusterConfig
from sloserve.cluster.controller import Controller, UtilisationAutoscaler
from sloserve.cluster.models import ModelRegistry, model_name_of
from sloserve.cluster.replica import ReplicaSpec
from sloserve.cluster.routing import make_router
from sloserve.core.errors import ConfigError
from sloserve.core.request import Request
from sloserve.costmodel.profile import ReplicaProfile, load_profile
from sloserve.costmodel.transfer import default_kv_link_gb_per_s, kv_transfer_time
from sloserve.engine.env import PRIO_CONTROL, Environment
from sloserve.engine.instance import Instance
from sloserve.experiments.cluster_result import (  # the result's names keep this path too
    ClusterRunResult as ClusterRunResult,
)
from sloserve.experiments.cluster_result import cluster_result
from sloserve.experiments.cluster_result import decisions_table as decisions_table
from sloserve.experiments.gc_freeze import frozen, paused_build
from sloserve.experiments.lazy_qlm import is_qlm
from sloserve.experiments.runner import (
    InstanceConfig,
    SimConfig,
    _BatchFeeder,
    build_instance,
    fresh,
    schedule_arrivals,
    workload_of,
)
from sloserve.experiments.session_feeder import SessionFeeder
from sloserve.workloads.identity import carries_prefix_identity
from sloserve.workloads.spec import Workload

if TYPE_CHECKING:
    from sloserve.cluster.qlm import HardwareProfile, QLMHooks


class RunWatch(Protocol):
    """Extension point: looks at a running simulation's requests and may stop it."""

    every_s: float
    """Simulated seconds between two looks (> 0)."""

    def __call__(self, now: float, requests: Sequence[Request]) -> bool:
        """True: stop the run now (``requests``: every request of the run, in arrival
        order, in their current state)."""
        ...


class StoppedEarly(Exception):  # a control-flow signal, not an error
    """Raised by :func:`simulate_cluster` when its ``watch`` stopped the run."""

    def __init__(self, at_s: float, requests: Sequence[Request], cluster: Cluster) -> None:
        super().__init__(f"stopped at {at_s:g} s")
        self.at_s = at_s
        self.requests = requests
        self.cluster = cluster


def group_configs(cfg: SimConfig, ccfg: ClusterConfig) -> list[SimConfig]:
    """Each replica group's SimConfig: the run's, with the group's overrides (the live
    gateway's emulated cluster builds its replicas from these too)."""
    out: list[SimConfig] = []
    for gi, g in enumerate(ccfg.replicas):
        over = g.instance_overrides()
        icfg = cfg.instance
        if over:
            try:
                icfg = InstanceConfig.model_validate({**cfg.instance.model_dump(), **over})
            except ValueError as e:
                raise ConfigError(f"cluster.replicas.{gi}: {e}") from None
        policy = g.policy or cfg.policy
        if g.policy_params is not None:
            params = g.policy_params
        else:
            params = cfg.policy_params if policy == cfg.policy else {}
        out.append(
            cfg.model_copy(update={"instance": icfg, "policy": policy, "policy_params": params})
        )
    return out


class _Loader:
    """The cluster's :class:`~sloserve.cluster.cluster.ModelLoader` over the registry."""

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    def load_time(self, spec: ReplicaSpec, model: str, tier: str) -> float:
        return self.registry.load_time(model, load_profile(spec.profile), tier)

    def respec(self, spec: ReplicaSpec, model: str) -> ReplicaSpec:
        profile = self.registry.profile_for(model, load_profile(spec.profile))
        return dataclasses.replace(spec, model=model, profile=profile)

    def tier(self, model: str) -> str:
        return self.registry.get(model).tier


@paused_build  # the collector on only while the run runs (experiments/gc_freeze.py)
def simulate_cluster(
    cfg: SimConfig,
    cluster: ClusterConfig | None = None,
    requests: Sequence[Request] | Workload | None = None,
    *,
    check_invariants: bool = False,
    watch: RunWatch | None = None,
) -> ClusterRunResult:
    """Run ``cfg``'s workload on the cluster ``cluster`` describes (default: one replica);
    ``watch`` may stop it early (:class:`StoppedEarly`)."""
    t0 = time.perf_counter()
    ccfg = cluster or ClusterConfig()
    read = functools.cache(load_profile)  # one YAML read per profile and run
    ccfg.check(horizon_s=cfg.horizon_s, profile=cfg.instance.profile, policy=cfg.policy, load=read)
    gcfgs = group_configs(cfg, ccfg)
    if isinstance(requests, Workload):
        workload = requests
    elif requests is not None:
        workload = Workload(list(requests), [], cfg.workload.batch_jobs)
    else:
        workload = workload_of(cfg, read(cfg.instance.profile))
    # Requests built here are this run's own: only a caller's need copying.
    reqs = fresh(workload.requests) if requests is not None else list(workload.requests)
    groups = ccfg.group_of()
    profiles: dict[int, ReplicaProfile] = {}
    specs = []
    for rid, gi in enumerate(groups):
        g, gcfg = ccfg.replicas[gi], gcfgs[gi]
        if gi not in profiles:
            profiles[gi] = read(gcfg.instance.profile)
        model = g.model or model_name_of(profiles[gi])
        specs.append(
            ReplicaSpec(rid, gi, gcfg.instance.profile, gcfg.policy, model, g.start_s, g.role)
        )
    first_profile: dict[str, str] = {}
    for s in specs:
        first_profile.setdefault(s.model, s.profile)
    registry = ModelRegistry(ccfg.models, first_profile, ccfg.transfer, read)
    for i, sw in enumerate(ccfg.model_swaps):
        try:
            registry.get(sw.model)
        except ConfigError as e:
            raise ConfigError(f"cluster.model_swaps.{i}.model: {e}") from None
    served = {s.model for s in specs} | {sw.model for sw in ccfg.model_swaps}
    if cfg.workload.models is not None:
        for m in cfg.workload.models:
            if m not in served and m not in ccfg.models:
                raise ConfigError(
                    f"workload.models: model {m!r} is served by no replica "
                    f"(replica models: {', '.join(sorted(served))})"
                )
    served |= set(ccfg.models)
    unserved = sorted({r.model for r in reqs} - served - {"default"})
    if unserved:
        raise ConfigError(
            f"workload: model {unserved[0]!r} is served by no replica "
            f"(replica models: {', '.join(sorted(served))})"
        )
    env = Environment()
    # Every replica, joining or recovering later too, sees only this run's requests.
    ids = carries_prefix_identity(reqs, workload.sessions)

    def make_instance(spec: ReplicaSpec, instance_id: int) -> Instance:
        gcfg = gcfgs[spec.group]
        if spec.profile != gcfg.instance.profile:  # it changed model: another profile
            icfg = gcfg.instance.model_copy(update={"profile": spec.profile})
            gcfg = gcfg.model_copy(update={"instance": icfg})
            return build_instance(
                gcfg,
                env,
                check_invariants=check_invariants,
                instance_id=instance_id,
                prefix_identities=ids,
            )
        return build_instance(
            gcfg,
            env,
            check_invariants=check_invariants,
            instance_id=instance_id,
            profile=profiles[spec.group],
            prefix_identities=ids,
        )

    rparams = dict(ccfg.router_params)
    seed = int(rparams.pop("seed", cfg.workload.seed))
    router = make_router(ccfg.router, rparams, seed=seed)
    pd = ccfg.disaggregated
    # Its own router state (a rotation over decode replicas, its own draws).
    decode_router = make_router(ccfg.router, rparams, seed=seed) if pd else None
    split = getattr(router, "split_phases", None)
    if decode_router is not None and split is not None:  # Aladdin's split phases (§5.1)
        split(decode_router)
        dg = next(i for i, g in enumerate(ccfg.replicas) if g.role == "decode")
        _bind_router(decode_router, profiles[dg], gcfgs[dg], reqs)
    _bind_router(router, profiles[0], gcfgs[0], reqs)
    # A router that is also a controller (QLM's) is the cluster's controller.
    controller: Any = UtilisationAutoscaler(ccfg.autoscaler) if ccfg.autoscaler else None
    if is_qlm(router):
        if controller is not None or pd:
            raise ConfigError(
                f"cluster.router: {ccfg.router!r} plans the cluster itself; it does not "
                "combine with cluster.autoscaler or prefill/decode roles"
            )
        controller = router
    elif controller is None and hasattr(router, "on_tick") and hasattr(router, "on_event"):
        controller = cast(Controller, router)  # a router that also controls (Aladdin's)
    clu = Cluster(
        env,
        specs,
        make_instance,
        router,
        loader=_Loader(registry),
        cold_start=ccfg.cold_start,
        admission=ccfg.admission.build(),
        controller=controller,
        trace_decisions=ccfg.trace_decisions,
        servable=served,
        kv_transfer=_kv_transfer(ccfg, profiles) if pd else None,
        decode_router=decode_router,
    )
    if is_qlm(router):
        router.bind(qlm_hooks(clu, reqs, gcfgs, registry))
    for f in ccfg.failures:
        clu.schedule_failure(f.replica, f.at_s, f.recover_s)
    for d in ccfg.drains:
        clu.schedule_drain(d.replica, d.at_s)
    for sw in ccfg.model_swaps:
        clu.schedule_model_swap(sw.replica, sw.at_s, sw.model)
    feeder = _BatchFeeder(cfg, workload.batch_jobs, env, clu, reqs) if workload.batch_jobs else None
    turns = SessionFeeder(workload.sessions, env, clu)  # closed-loop session turns
    schedule_arrivals(env, reqs, clu)  # the same event chain as runner.simulate
    total = len(reqs)
    clu.pending_arrivals = lambda: clu.submitted < total or turns.pending > 0
    clu.start_controller()
    horizon = cfg.horizon_s if cfg.horizon_s is not None else math.inf
    if horizon != math.inf:
        env.schedule(horizon, lambda: None, PRIO_CONTROL)
    if watch is not None:
        _schedule_watch(env, watch, reqs, total, clu)
    with frozen():  # the run's long-lived objects out of the collector's passes
        env.run(until=horizon)
    left = clu.close(horizon)
    if feeder is not None:
        reqs = reqs + feeder.submitted
    reqs = [r for r in reqs + turns.submitted if r.req_id in clu.ended]
    sim_s = (
        horizon
        if left and horizon != math.inf
        else max([r.finish_time or 0.0 for r in reqs] + [0.0])
    )
    return cluster_result(cfg, ccfg, clu, reqs, sim_s, workload, feeder, t0, gcfgs, read)


def qlm_hooks(
    clu: Cluster, reqs: Sequence[Request], gcfgs: Sequence[SimConfig], registry: ModelRegistry
) -> QLMHooks:
    """QLM's view beyond the ClusterView: submitted requests by id, each replica's RCT
    constants (a profiling batch on a fresh copy of it, once per profile) and model load
    times (warm from CPU memory when the replica held the model before)."""
    from sloserve.cluster.qlm import QLMHooks, profile_replica

    by_id: dict[int | str, Request] = {r.req_id: r for r in reqs}
    profiles: dict[str, HardwareProfile] = {}
    loader = _Loader(registry)

    def profile(rid: int) -> HardwareProfile:
        spec = clu.replicas[rid].spec
        hw = profiles.get(spec.profile)
        if hw is None:
            icfg = gcfgs[spec.group].instance.model_copy(update={"profile": spec.profile})
            probe = build_instance(
                gcfgs[spec.group].model_copy(update={"instance": icfg}), Environment()
            )
            hw = profiles[spec.profile] = profile_replica(probe)
        return hw

    loads: dict[tuple[str, str, str], float] = {}

    def swap_s(rid: int, model: str) -> float:
        rep = clu.replicas[rid]
        if model == rep.spec.model:
            return 0.0
        tier = "cpu" if model in rep.warm_models else loader.tier(model)
        key = (rep.spec.profile, model, tier)
        if key not in loads:  # a profile read per (profile, model, tier), not per call
            loads[key] = loader.load_time(loader.respec(rep.spec, model), model, tier)
        return loads[key]

    def set_warm(rid: int, models: set[str]) -> None:
        # The replica's CPU memory holds these models' weights (and the one it serves).
        rep = clu.replicas[rid]
        rep.warm_models = models | {rep.spec.model}

    def weight_bytes(model: str) -> float | None:
        return registry.get(model).weight_bytes if model in registry else None

    return QLMHooks(
        by_id.get, profile, swap_s, set_warm, weight_bytes, registry.transfer.disk_gb_per_s
    )


def _schedule_watch(
    env: Environment, watch: RunWatch, reqs: list[Request], total: int, clu: Cluster
) -> None:
    if not watch.every_s > 0:
        raise ConfigError(f"watch.every_s must be > 0, got {watch.every_s}")

    def look() -> None:
        if watch(env.now, reqs):
            raise StoppedEarly(env.now, reqs, clu)
        # keep looking while anything is left to happen (else the run would never end)
        if clu.submitted < total or len(clu.ended) < clu.submitted:
            env.schedule(env.now + watch.every_s, look, PRIO_CONTROL)

    env.schedule(watch.every_s, look, PRIO_CONTROL)


def _kv_transfer(
    ccfg: ClusterConfig, profiles: Mapping[int, ReplicaProfile]
) -> Callable[[ReplicaSpec, Request], float]:
    """The KV transfer time off a prefill replica (``costmodel/transfer.py``): its prompt's
    KV per GPU over ``transfer.kv_link_gb_per_s`` (unset: its GPU's measured rate)."""
    t = ccfg.transfer

    def transfer_time(spec: ReplicaSpec, req: Request) -> float:
        prof = profiles[spec.group]
        rate = t.kv_link_gb_per_s or default_kv_link_gb_per_s(prof.gpu)
        per_token = prof.model.kv_bytes_per_token_tp(prof.tp)
        return kv_transfer_time(
            req.num_computed_tokens, per_token, link_gb_per_s=rate, latency_s=t.kv_link_latency_s
        )

    return transfer_time


def _bind_router(
    router: Any, profile: ReplicaProfile, gcfg: SimConfig, reqs: list[Request]
) -> None:
    """A router that packs by a performance model (Aladdin's) learns group 0's profile and
    KV capacity; one that may use true output lengths (an oracle ablation) gets them."""
    bind = getattr(router, "bind_profile", None)
    if bind is not None:
        icfg = gcfg.instance
        bind(profile, icfg.kv_capacity_tokens or profile.kv_capacity_tokens(icfg.kv_utilization))
    true_out = getattr(router, "true_out", None)
    if isinstance(true_out, dict):
        true_out.update({r.req_id: r.true_output_len for r in reqs})
