"""QLM's global part as one object (``papers/qlm.txt`` §3–§7): the router ``qlm`` that is
also the cluster's controller, and the baselines ``edf`` and ``fcfs`` that share its pull.

Requests live once, in the cluster's global queue. Each arriving request joins a request
group (``groups.py``); each group has a place in one replica's *virtual queue* (an ordered
list of group ids). A request leaves the global queue only when its replica has spare
capacity (the **pull** LSO: ``outstanding < R_max``), so the router answers :class:`Hold`
otherwise. On every request end (room frees) and every tick the controller side reorders
the front of the model's global queue to the requests the replicas with room will pull
next — the heads of their virtual queues, FCFS inside a group — so the cluster's in-order
pull realises the virtual queues (:class:`ReorderQueue`).

**Plan generator calls** (§4 "Handling new incoming requests"): when a new group forms, the
RCT estimator (``rct.py``) prices it at the tail of the queue where it completes first; on
every arrival it also prices the groups of the virtual queue the request joins, in place
(``placement.py``). A predicted violation (an α-quantile completion past
a deadline that the head of the queue would meet) or a failure re-plans all groups
(``plan.py``), at most once per ``replan_interval_s`` of simulated time (a choice: bursts
of arrivals would otherwise re-plan per arrival). A plan replaces the virtual queues in
force only when it scores better under the same estimates (``keeps_incumbent``).

**Load balancing** is the assignment itself; a dispatched request never migrates.
**Model changes**: when the head group of a replica's virtual queue is of another model,
the replica changes model: ``swap: drain`` finishes what it holds, then loads; ``flush``
(the paper's, §5) gives it back to QLM's queues and loads at once (``flush.py``).
**Model warm start** (§5): the models of the next groups in its queue that fit the
replica's CPU memory (``cpu_mem_gib``, bytes of weights) are read there from disk
(``disk_gb_per_s``, one after another) and, once read, a change to one of them loads warm
(host-to-GPU); any other loads cold from disk (``cluster/models.py``). Model changes and
warm start live in ``changes.py`` and ``warm.py``; placement in ``placement.py``.
**Eviction and GPU↔CPU swap** happen on the replica, in its ``qlm`` policy
(``policies/qlm/agent.py``).

Baselines (same pull, no groups or plan): ``edf`` pulls the earliest absolute deadline of
the model's queue to the least-loaded replica with room; ``fcfs`` pulls in arrival order.
Their model changes follow the queue's head: an idle replica changes to the model of the
head request (the paper's EDF that swaps whenever the order says so), and a model no
replica serves makes the least-loaded replica change.

Live (``sloserve serve --backend emulated --router qlm``): the gateway's cluster binds no
hooks and runs no controller, so replicas are priced with :data:`NOMINAL_PROFILE`, groups
form as requests are routed, and pulls follow the cluster's in-order queue (no reorders,
no model changes).

Ablations (``lsos``, a subset of ``pull,balance,warm-start``): without ``pull`` a request is
sent to its group's replica at once (it waits there); without ``balance`` groups go to
their model's replicas in rotation, in deadline order, with no plan; without
``warm-start`` no model is kept in CPU memory: every model change loads cold.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sloserve.cluster.controller import Action, Event, ReorderQueue
from sloserve.cluster.qlm.changes import swap_for_head, warm_start
from sloserve.cluster.qlm.flush import check_swap
from sloserve.cluster.qlm.groups import GroupingConfig, GroupTable, RequestGroup
from sloserve.cluster.qlm.hooks import QLMHooks, QLMStats
from sloserve.cluster.qlm.placement import best_tail, place, violation_ahead
from sloserve.cluster.qlm.plan import (
    Plan,
    PlanGroup,
    PlannerConfig,
    PlanQueue,
    generate_plan,
    keeps_incumbent,
)
from sloserve.cluster.qlm.rct import (
    HardwareProfile,
    OutputLengthModel,
    RCTEstimator,
    z_of,
)
from sloserve.cluster.qlm.warm import DEFAULT_CPU_MEM_GIB, CPUMemory, make_cpu_memory
from sloserve.cluster.routing import Decision, Hold, Router
from sloserve.cluster.view import ClusterView, ReplicaStatus, ReplicaView, RouteRequest
from sloserve.core.errors import ConfigError
from sloserve.costmodel.transfer import DEFAULT_DISK_GB_PER_S

LSOS = frozenset({"pull", "balance", "warm-start"})

NOMINAL_PROFILE = HardwareProfile(6.5e-5, 0.0480, 2276.0, 1.20, 119_696)
"""RCT constants without a simulation to profile (the live gateway): the profiling batch's
numbers for Llama-2-7B on an A100 (``llama-2-7b-a100``)."""


class QLMRouter(Router):
    """``qlm`` (mode ``qlm``) and the pull baselines ``edf`` / ``fcfs`` (module docstring)."""

    reads_progress = False  # request counts, models and status only
    wants_events = True

    def __init__(
        self,
        mode: str,
        *,
        grouping: GroupingConfig,
        planner: PlannerConfig,
        alpha: float,
        prior: tuple[float, float, float],
        lsos: frozenset[str],
        tick_s: float,
        replan_interval_s: float,
        cpu_memory: Callable[[], CPUMemory] | None = None,
        disk_rate_given: bool = False,
        swap: str = "drain",
    ) -> None:
        self.name = mode
        self._new_cpu_memory = cpu_memory or make_cpu_memory(
            DEFAULT_CPU_MEM_GIB, DEFAULT_DISK_GB_PER_S, None
        )
        self.disk_rate_given = disk_rate_given
        """``router_params.disk_gb_per_s`` was set (it wins over the cluster's rate)."""
        self.swap = check_swap(swap)
        """``router_params.swap``: what a model change does with the requests held."""
        self.cpu_mem: dict[int, CPUMemory] = {}
        """Per replica: the model weights in its CPU memory (the warm-start LSO)."""
        self.mode = mode
        self.tick_s: float | None = tick_s
        self.table = GroupTable(grouping)
        self.planner = planner
        self.rct = RCTEstimator(OutputLengthModel(*prior), alpha)
        self.lsos = lsos
        self.replan_interval_s = replan_interval_s
        self.hooks: QLMHooks | None = None
        self.stats = QLMStats()
        self.vq: dict[int, list[int]] = {}
        """Virtual queues: replica id → group ids, head first."""
        self._assign: dict[int, int] = {}
        self._held: dict[int | str, RouteRequest] = {}
        self._dispatched: dict[int | str, tuple[int, Any]] = {}
        self._changing: dict[int, str] = {}
        self._unserved_since_change: set[int] = set()  # flush.py's progress rule
        self._loaded_at: dict[int, float] = {}
        """When each model change issued is expected to end (its drain and load priced)."""
        self._last_plan = -math.inf
        self._dirty = False
        self._turn: dict[str, int] = {}
        self._retiring: int | None = None
        """The replica of the request whose finish is being handled (``flush_waits``)."""

    def bind(self, hooks: QLMHooks) -> None:
        """Attach the simulation's hooks (before the run starts). Without
        ``router_params.disk_gb_per_s`` the reads into CPU memory go at the cluster's own
        checkpoint read rate, the one its model loads are priced at."""
        self.hooks = hooks
        if hooks.disk_gb_per_s is not None and not self.disk_rate_given:
            base, rate = self._new_cpu_memory, hooks.disk_gb_per_s * 1e9
            self._new_cpu_memory = lambda: dataclasses.replace(base(), disk_bytes_per_s=rate)

    def read_ends_at(self, replica_id: int, model: str, now: float) -> float | None:
        """The cluster's load hook (``cluster/lifecycle.py``, :class:`ReadsIntoCPU`): when
        the warm-start read of ``model`` into the replica's CPU memory ends, if begun."""
        mem = self.cpu_mem.get(replica_id)
        return None if mem is None else mem.read_end(model, now)

    # ------------------------------------------------------------------ helpers
    def _hw(self, rid: int) -> HardwareProfile:
        # The hooks cache per profile: a replica that changed model has another one.
        if self.hooks is None:
            return NOMINAL_PROFILE
        return self.hooks.profile(rid)

    @staticmethod
    def _serves(v: ReplicaView, model: str) -> bool:
        return model == "default" or v.model == model

    @staticmethod
    def _has_room(v: ReplicaView) -> bool:
        return v.status is ReplicaStatus.UP and v.outstanding < max(v.capacity, 1)

    def _live(self, view: ClusterView) -> list[ReplicaView]:
        return [
            v
            for v in view.replicas()
            if v.status in (ReplicaStatus.UP, ReplicaStatus.LOADING, ReplicaStatus.DRAINING)
        ]

    def _ready(self, v: ReplicaView, now: float) -> tuple[float, float]:
        m, var = self.rct.in_flight(v.outstanding, v.capacity, None, self._hw(v.replica_id))
        # a replica changing model serves nothing until its load ends (as priced at the change)
        if v.status is not ReplicaStatus.UP or v.replica_id in self._changing:
            m += max(0.0, self._loaded_at.get(v.replica_id, now) - now)
        return m, var

    def _deadline(self, r: RouteRequest) -> float:
        d = r.slo.deadline_s
        return r.arrival + (d if d is not None else self.table.cfg.default_deadline_s)

    # ------------------------------------------------------------------ arrivals
    def _see(self, rr: RouteRequest, view: ClusterView) -> None:
        if rr.req_id in self._held:
            return
        prev = self._dispatched.get(rr.req_id)
        if prev is not None and prev[0] < 0:
            return  # seen at its arrival event, not dispatched yet
        if prev is not None:  # dispatched before: back from a failed or requeued replica
            del self._dispatched[rr.req_id]
        self._held[rr.req_id] = rr
        if self.mode != "qlm":
            return
        self.rct.observe_prompt(rr.prompt_tokens)
        g = self.table.add(rr)
        if g.group_id in self._assign:
            # §4: a request joining a group re-runs the RCT estimate of its queue
            if self._violation_ahead(view, self._assign[g.group_id]):
                self._replan(view)
            return
        live = self._live(view)
        if not live:
            return
        if "balance" not in self.lsos:
            cand = [v for v in live if v.model == g.model] or live
            k = self._turn.get(g.model, -1) + 1
            self._turn[g.model] = k
            place(self, g, cand[k % len(cand)].replica_id)
            return
        rid, quant, mean = best_tail(self, g, live, view.now)
        place(self, g, rid, self._changing.get(rid, view.replica(rid).model))
        self._predict(rr, mean)
        # Insight #1's waiting time: the mean completion less the group's own part
        self.stats.wait_pred[rr.req_id] = mean - self.rct.completion(g, self._hw(rid))[0]
        if quant > g.deadline or self._dirty or self._violation_ahead(view, rid):
            self._replan(view)

    def _violation_ahead(self, view: ClusterView, rid: int) -> bool:
        return violation_ahead(self, view, rid)  # placement.py: the re-planning trigger

    def _swap(self, rid: int, model: str) -> float:
        """What changing replica ``rid`` to ``model`` costs: the load (warm or cold), plus
        the drain before it — a change waits for the held requests to finish while the
        batch shrinks; priced as one request's whole decode, μ·t_d·ε (a choice)."""
        if model == "default" or self.hooks is None:
            return 0.0
        load = self.hooks.swap_s(rid, model)
        if load <= 0:
            return 0.0
        hw = self._hw(rid)
        mu = 0.0 if self.swap == "flush" else self.rct.lengths.prior[0]  # flush: no drain
        return load + mu * hw.decode_s_per_token * hw.inefficiency

    def _predict(self, rr: RouteRequest, mean_abs: float) -> None:
        self._dispatched.setdefault(rr.req_id, (-1, mean_abs))

    # ------------------------------------------------------------------ planning
    def _replan(self, view: ClusterView) -> None:
        now = view.now
        if now - self._last_plan < self.replan_interval_s:
            self._dirty = True
            return
        self._dirty = False
        self._last_plan = now
        live = self._live(view)
        if not live:
            return
        for v in live:  # every live replica has a queue, if empty (on_tick's B2 check)
            self.vq.setdefault(v.replica_id, [])
        z = self.rct.z
        queues, hws = [], []
        for v in live:
            hw = self._hw(v.replica_id)
            m, var = self._ready(v, now)
            swaps = {g.model: self._swap(v.replica_id, g.model) for g in self.table}
            ready = m + z * math.sqrt(var)
            swap = max(swaps.values(), default=0.0)
            queues.append(
                PlanQueue(
                    v.replica_id,
                    self._changing.get(v.replica_id, v.model),  # a change under way counts
                    ready,
                    swap,
                    tuple(sorted(swaps.items())),
                )
            )
            hws.append(hw)
        pgs = []
        for g in self.table:
            work, comp = [], []
            for hw in hws:
                w, wv = self.rct.work(g, hw)
                c, cv = self.rct.completion(g, hw)
                work.append(w + z * math.sqrt(wv))
                comp.append(c + z * math.sqrt(cv))
            pgs.append(PlanGroup(g.group_id, g.model, g.deadline - now, tuple(work), tuple(comp)))
        plan = generate_plan(pgs, queues, self.planner)
        self._record(plan)
        if keeps_incumbent(plan, pgs, queues, self.vq):
            self.stats.kept_incumbent += 1
            return
        self.vq = {rid: list(gids) for rid, gids in plan.queues.items()}
        self._assign = {gid: rid for rid, gids in self.vq.items() for gid in gids}

    def _record(self, plan: Plan) -> None:
        s = self.stats
        s.plan_calls += 1
        s.methods[plan.method] = s.methods.get(plan.method, 0) + 1
        s.fallbacks += plan.method == "edf-fallback"
        s.infeasible_plans += not plan.feasible
        s.solve_s_total += plan.solve_s
        s.solve_s_max = max(s.solve_s_max, plan.solve_s)

    # ------------------------------------------------------------------ routing
    def route(self, req: RouteRequest, view: ClusterView) -> Decision:
        self._see(req, view)
        if self.mode == "qlm":
            g = self.table.group_of(req.req_id)
            rid = None if g is None else self._assign.get(g.group_id)
            if rid is None:
                return Hold("qlm_unplanned")
            v = view.replica(rid)
            # Not to a replica leaving its model: it serves only req.model (or "default")
            # now, so a request of its next model cannot reach it before the load either.
            leaving = self._changing.get(rid, v.model) != v.model
            if not (v.status is ReplicaStatus.UP and self._serves(v, req.model)) or (
                leaving and req.model != "default"
            ):
                return Hold("qlm_vq")
            if "pull" in self.lsos and not self._has_room(v):
                return Hold("qlm_vq")
            return self._dispatch(req, rid)
        cand = [v for v in view.serving(req.model) if self._has_room(v)]
        if not cand:
            return Hold("no_room")
        best = min(cand, key=lambda v: (v.outstanding, v.replica_id))
        return self._dispatch(req, best.replica_id)

    def _dispatch(self, req: RouteRequest, rid: int) -> int:
        self._held.pop(req.req_id, None)
        prev = self._dispatched.get(req.req_id)
        self._dispatched[req.req_id] = (rid, None if prev is None else prev[1])
        g = self.table.remove(req.req_id)
        if g is not None and g.group_id not in self.table.groups:
            self._drop_group(g.group_id)
        return rid

    def _drop_group(self, gid: int) -> None:
        rid = self._assign.pop(gid, None)
        if rid is not None and gid in self.vq.get(rid, []):
            self.vq[rid].remove(gid)

    # ------------------------------------------------------------------ controller
    def on_event(self, event: Event, view: ClusterView) -> list[Action]:
        if event.kind == "arrival" and event.req_id is not None and self.hooks is not None:
            r = self.hooks.request(event.req_id)
            if r is not None:
                self._see(RouteRequest.of(r), view)
            return []
        if event.kind == "failure":
            self._dirty = True
            if event.replica is not None:
                # the cluster cancels the change (lifecycle.fail): forget it too, or the
                # replica back up would never be asked for that model again (B1)
                self._changing.pop(event.replica, None)
                self._loaded_at.pop(event.replica, None)
                for gid in self.vq.pop(event.replica, []):
                    self._assign.pop(gid, None)
                    g = self.table.groups.get(gid)
                    if g is not None:
                        self._see_again(g, view)
            return []
        if event.kind == "finish" and event.req_id is not None:
            # delivered while its replica retires a batch: no flush of it now (flush.py)
            self._retiring = self._dispatched.get(event.req_id, (None, None))[0]
            self._unserved_since_change.discard(
                self._retiring if self._retiring is not None else -1
            )
            self._finished(event.req_id)
            try:
                return self._actions(view)
            finally:
                self._retiring = None
        return self._actions(view)

    def _see_again(self, g: RequestGroup, view: ClusterView) -> None:
        live = [v for v in self._live(view) if v.replica_id not in (-1,)]
        if live:
            rid, _, _ = best_tail(self, g, live, view.now)
            place(self, g, rid, view.replica(rid).model)

    def _finished(self, req_id: int | str) -> None:
        info = self._dispatched.pop(req_id, None)
        if self._held.pop(req_id, None) is not None:  # ended while queued: leaves its group
            g = self.table.remove(req_id)
            if g is not None and g.group_id not in self.table.groups:
                self._drop_group(g.group_id)
        if info is None or self.hooks is None:
            return
        r = self.hooks.request(req_id)
        if r is None or r.finish_time is None or r.status.name != "FINISHED":
            return
        self.stats.waited(req_id, r)
        if self.mode == "qlm":
            self.rct.lengths.observe(self.table.key_of(RouteRequest.of(r)), r.num_output_tokens)
            if info[1] is not None:
                self.stats.predicted.append(info[1] - r.arrival)
                self.stats.actual.append(r.finish_time - r.arrival)

    def on_tick(self, now: float, view: ClusterView, queued: Mapping[str, int]) -> list[Action]:
        if self.mode == "qlm" and any(
            v.status is ReplicaStatus.UP and v.replica_id not in self.vq for v in view.replicas()
        ):
            # a replica back from a failure (no event says so) has no virtual queue yet:
            # re-plan so it takes work back even when no arrival comes to trigger it (B2)
            self._dirty = True
        if self.mode == "qlm" and self._dirty:
            self._replan(view)
        return self._actions(view)

    def _actions(self, view: ClusterView) -> list[Action]:
        out: list[Action] = []
        if self.mode == "qlm":
            out += warm_start(self, view)
        elif self.mode != "qlm":
            out += swap_for_head(self, view)
        out += self._reorders(view)
        return out

    def _reorders(self, view: ClusterView) -> list[Action]:
        """Front of each model's global queue: what the replicas with room pull next."""
        if not self._held:
            return []
        fronts: dict[str, list[tuple[Any, ...]]] = {}
        if self.mode == "qlm":
            for rid, gids in self.vq.items():
                v = view.replica(rid)
                room = max(v.capacity, 1) - v.outstanding if self._has_room(v) else 0
                pos = 0
                for gid in gids:
                    g = self.table.groups.get(gid)
                    if g is None or room <= 0:
                        continue
                    if not self._serves(v, g.model):
                        break
                    for r in g.requests[:room]:
                        fronts.setdefault(r.model, []).append((pos, rid, r.req_id))
                        pos += 1
                    room -= min(room, g.size)
        else:
            room = sum(
                max(v.capacity, 1) - v.outstanding for v in view.replicas() if self._has_room(v)
            )
            if room <= 0:
                return []
            key = self._deadline if self.mode == "edf" else (lambda r: r.arrival)
            for r in heapq.nsmallest(room, self._held.values(), key=lambda r: (key(r), r.arrival)):
                fronts.setdefault(r.model, []).append((len(fronts.get(r.model, [])), 0, r.req_id))
        return [ReorderQueue(m, tuple(x[2] for x in sorted(f))) for m, f in sorted(fronts.items())]

    def summary(self) -> dict[str, Any]:
        """The run's ``qlm`` block (plan calls, methods, solve time, fallbacks, RCT R²)."""
        d = self.stats.as_dict()
        d["mode"] = self.mode
        d["lsos"] = sorted(self.lsos)
        d["alpha"] = self.rct.alpha
        d["group_size_factor"] = self.table.cfg.group_size_factor
        return d


def _lsos(value: str | Iterable[str]) -> frozenset[str]:
    items = [s.strip() for s in value.split(",")] if isinstance(value, str) else list(value)
    items = [s for s in items if s]
    bad = sorted(set(items) - LSOS)
    if bad:
        raise ConfigError(
            f"router_params.lsos: unknown LSO {bad[0]!r}; valid: {', '.join(sorted(LSOS))}"
        )
    return frozenset(items)


def make_qlm_router(
    mode: str,
    seed: int = 0,
    *,
    alpha: float = 0.9,
    group_size_factor: float = 4.0,
    avg_batch_size: int = 16,
    time_limit_s: float = 5.0,
    node_limit: int = 50,
    max_milp_vars: int = 80,
    output_mean: float = 256.0,
    output_std: float = 128.0,
    prior_weight: float = 20.0,
    lsos: str | Iterable[str] = "pull,balance,warm-start",
    tick_s: float = 1.0,
    replan_interval_s: float = 1.0,
    cpu_models: int | None = None,
    cpu_mem_gib: float = DEFAULT_CPU_MEM_GIB,
    disk_gb_per_s: float | None = None,
    swap: str = "drain",
) -> QLMRouter:
    """The router (module docstring); every bad parameter is a one-line ConfigError."""
    try:
        z_of(alpha)
    except ConfigError as e:
        raise ConfigError(f"router_params.{e}") from None
    if not 0 < tick_s <= 3600 or not 0 <= replan_interval_s <= 3600:
        raise ConfigError(
            f"router_params.tick_s: must be in (0, 3600], got {tick_s}"
            if not 0 < tick_s <= 3600
            else f"router_params.replan_interval_s: must be in [0, 3600], got {replan_interval_s}"
        )
    if cpu_models is not None and (not isinstance(cpu_models, int) or cpu_models < 0):
        raise ConfigError(f"router_params.cpu_models: must be an integer >= 0, got {cpu_models}")
    memory = make_cpu_memory(
        cpu_mem_gib, DEFAULT_DISK_GB_PER_S if disk_gb_per_s is None else disk_gb_per_s, cpu_models
    )
    try:
        grouping = GroupingConfig(group_size_factor, avg_batch_size)
        planner = PlannerConfig(time_limit_s, max_milp_vars, node_limit)
        OutputLengthModel(output_mean, output_std, prior_weight)
    except ConfigError as e:
        raise ConfigError(f"router_params.{e}") from None
    return QLMRouter(
        mode,
        grouping=grouping,
        planner=planner,
        alpha=alpha,
        prior=(output_mean, output_std, prior_weight),
        lsos=_lsos(lsos),
        tick_s=tick_s,
        replan_interval_s=replan_interval_s,
        cpu_memory=memory,
        disk_rate_given=disk_gb_per_s is not None,
        swap=swap,
    )
