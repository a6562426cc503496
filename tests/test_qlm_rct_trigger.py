"""QLM's accurate RCT estimator and its re-planning trigger: waiting beyond free slots,
the profiling batch at the replica's real batch, the trigger on a request joining a group
(§4, §7) and the incumbent check (a plan replaces the queues in force only if better)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import pytest

from helpers import make_instance
from sloserve.cluster.qlm import (
    GroupingConfig,
    GroupTable,
    HardwareProfile,
    OutputLengthModel,
    PlanGroup,
    PlanQueue,
    RCTEstimator,
    generate_plan,
    make_qlm_router,
)
from sloserve.cluster.qlm.plan import PlannerConfig, keeps_incumbent
from sloserve.cluster.qlm.rct import profile_batch
from sloserve.cluster.view import ClusterView, ReplicaStatus, RouteRequest
from sloserve.core.request import SLO

HW = HardwareProfile(0.001, 0.01, 100.0, 1.0)


def test_waiting_counts_only_requests_beyond_the_free_slots() -> None:
    est = RCTEstimator(OutputLengthModel(50.0, 10.0, 1.0), alpha=0.5)
    assert est.in_flight(10, 16, None, HW) == (0.0, 0.0)  # a free slot: starts at once
    # full: the next request waits for one end, μ/Θ = 0.5 s; 4 beyond: 5 ends
    assert est.in_flight(16, 16, None, HW) == pytest.approx((0.5, 0.01))
    assert est.in_flight(20, 16, None, HW) == pytest.approx((2.5, 0.05))
    # a KV cache of 1,000 tokens holds 10 requests of 50 prompt + 50 output tokens:
    # 12 on the replica, 3 ends before the next
    kv = HardwareProfile(0.001, 0.01, 100.0, 1.0, kv_tokens=1000)
    est.observe_prompt(40)
    est.observe_prompt(60)
    assert est.prompt_mean == 50.0
    assert est.in_flight(12, 16, None, kv) == pytest.approx((1.5, 0.03))


def test_the_profiling_batch_is_what_the_kv_cache_holds_up_to_r_max() -> None:
    assert profile_batch(make_instance(M=10_000, R_max=256), 512, 256) == 13  # 10,000 // 768
    assert profile_batch(make_instance(M=10_000, R_max=8), 512, 256) == 8
    assert profile_batch(make_instance(M=100, R_max=8), 512, 256) == 1


@dataclass
class _Rep:
    replica_id: int
    outstanding: int
    capacity: int = 4
    model: str = "m"
    status: ReplicaStatus = ReplicaStatus.UP


@dataclass
class _View:
    reps: list[_Rep]
    now: float = 0.0

    def replica(self, rid: int) -> _Rep:
        return self.reps[rid]

    def replicas(self) -> list[_Rep]:
        return self.reps


def _rr(i: int, deadline: float) -> RouteRequest:
    return RouteRequest(i, "m", 100, 0.0, SLO(deadline_s=deadline))


def test_a_request_joining_a_group_replans_when_a_savable_group_is_late() -> None:
    # NOMINAL profile: μ/Θ = 500/2276 s per request end; an rt decode 500 × 48 ms × 1.2
    router = make_qlm_router("qlm", output_mean=500.0, output_std=0.0, prior_weight=1.0)
    view = cast(ClusterView, _View([_Rep(0, outstanding=4)]))
    router._see(_rr(0, 300.0), view)  # a batch group of one
    router._see(_rr(10, 29.5), view)  # an rt group behind it: still on time
    assert router.stats.plan_calls == 0 and len(router.vq[0]) == 2
    assert not router._violation_ahead(view, 0)
    router._see(_rr(1, 300.0), view)  # joins the batch group ahead: rt still on time
    assert router.stats.plan_calls == 0
    router._see(_rr(2, 300.0), view)  # one more: now rt is late, but not at the head
    assert router.stats.plan_calls == 1
    # the plan put the rt group first (EDF order, the only one on time)
    assert router.table.groups[router.vq[0][0]].deadline == pytest.approx(29.5)


def test_a_plan_replaces_the_queues_in_force_only_when_better() -> None:
    groups = [PlanGroup(0, "a", 5.0, (3.0,), (3.0,)), PlanGroup(1, "a", 100.0, (3.0,), (3.0,))]
    queues = [PlanQueue(0, "a", 0.0, 1.0)]
    plan = generate_plan(groups, queues, PlannerConfig())
    assert plan.queues == {0: [0, 1]}
    assert keeps_incumbent(plan, groups, queues, {0: [0, 1]})  # the same: kept
    assert not keeps_incumbent(plan, groups, queues, {0: [1, 0]})  # group 0 late: replaced
    assert not keeps_incumbent(plan, groups, queues, {0: [0]})  # group 1 unplaced


def test_grouping_config_is_untouched() -> None:
    assert GroupTable(GroupingConfig()).cfg.group_size_factor == 4.0


def test_per_model_swap_times_price_the_greedy_plan() -> None:
    q = PlanQueue(0, "a", 0.0, 100.0, (("b", 1.0),))
    assert (q.swap("b"), q.swap("c")) == (1.0, 100.0)
    groups = [PlanGroup(0, "b", 50.0, (1.0, 1.0), (2.0, 2.0))]
    # queue 1 serves "c": a change to "b" costs 100 s there (the constant), 1 s on queue 0
    queues = [PlanQueue(0, "a", 5.0, 100.0, (("b", 1.0),)), PlanQueue(1, "c", 0.0, 100.0)]
    plan = generate_plan(groups, queues, PlannerConfig(max_milp_vars=0))
    assert plan.method == "heuristic" and plan.queues == {0: [0], 1: []}


def _router_with_head(deadline: float, outstanding: int) -> tuple[object, list[object]]:
    from sloserve.cluster.qlm.changes import warm_start

    router = make_qlm_router("qlm", output_mean=50.0, output_std=0.0, prior_weight=1.0)
    view = cast(ClusterView, _View([_Rep(0, outstanding=outstanding, model="m")]))
    rr = RouteRequest(1, "x", 100, 0.0, SLO(deadline_s=deadline))
    router._see(rr, view)
    router.vq = {0: [router.table.group_of(1).group_id]}  # type: ignore[union-attr]
    return router, warm_start(router, view)


def test_a_busy_replica_defers_a_model_change_the_head_deadline_allows() -> None:
    assert _router_with_head(300.0, outstanding=3)[1] == []  # slack: keep serving "m"
    assert len(_router_with_head(300.0, outstanding=0)[1]) == 1  # idle: change now
    assert len(_router_with_head(0.5, outstanding=3)[1]) == 1  # late even now: no wait
