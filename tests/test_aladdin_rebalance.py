"""Aladdin §4.3 Algorithm 2: re-balancing unstarted requests away from underestimated workers."""

from __future__ import annotations

from typing import Any

import pytest

from sloserve.cluster.aladdin.lengths import LengthPredictor
from sloserve.cluster.aladdin.perf_models import PerfModels
from sloserve.cluster.aladdin.placement import Placed, Placement, Slo
from sloserve.cluster.aladdin.rebalance import Move, Rebalancer
from sloserve.core.request import Request, RequestStatus

M = PerfModels(h=1.0, j=0.0, k1=1e-4, c1=0.01, k2=1e-6, c2=1e-3, c3=0.01)
SLO = Slo(ttft_s=0.5, atgt_s=0.05)


def _ledger() -> tuple[Placement, Rebalancer]:
    # Every history output is 50 tokens: predictions are 50, a re-prediction is "one more".
    pl = Placement(M, SLO, LengthPredictor([10] * 10, [50] * 10), theta=1.0)
    for wid in (0, 1, 2):
        pl.add_worker(wid, 1e9)
    return pl, Rebalancer(pl)


def test_new_request_leaves_an_underestimated_worker() -> None:
    pl, rb = _ledger()
    w0 = pl.workers[0]
    # Two requests placed at t=0 that, by t=2 s, have run far past their 50 tokens...
    for i in range(2):
        w0.requests[i] = Placed(i, 10, 50, placed_at=0.0)
        pl.where[i] = 0
    # ...and a new one placed just now, still waiting there.
    w0.requests["new"] = Placed("new", 10, 50, placed_at=1.99)
    pl.where["new"] = 0
    moves = rb.plan(2.0, {0: 1, 1: 0, 2: 0}, {0: 10, 1: 0, 2: 0})
    assert moves == [Move("new", 0, 1)]
    assert rb.error(w0, 2.0) > 0 and rb.error(pl.workers[1], 2.0) == 0
    # Nothing waits there: nothing to move (started requests never move).
    assert rb.plan(2.0, {0: 0, 1: 0, 2: 0}, {}) == []


def test_worker_on_plan_keeps_its_new_requests_and_early_finish_attracts() -> None:
    pl, rb = _ledger()
    w0 = pl.workers[0]
    w0.requests["a"] = Placed("a", 10, 50, placed_at=0.0)
    pl.where["a"] = 0
    # At t=0.05 nothing outlived its prediction: no error, no move.
    assert rb.plan(0.05, {0: 1, 1: 0, 2: 0}, {}) == []
    # A request on worker 2 finishes after ~1 of its 50 predicted tokens: overestimated.
    w2 = pl.workers[2]
    w2.requests["b"] = Placed("b", 10, 50, placed_at=0.0)
    pl.where["b"] = 2
    gone = pl.remove("b")
    assert gone is not None
    rb.finished(gone[0], gone[1], 0.03)
    assert rb.error(w2, 0.03) < 0
    # Worker 0 (now underestimated at t=2) sends its waiting request to worker 2 first.
    w0.requests["new"] = Placed("new", 10, 50, placed_at=1.99)
    pl.where["new"] = 0
    rb.finished(gone[0], gone[1], 0.03)
    assert rb.plan(2.0, {0: 1, 1: 0, 2: 0}, {}) == [Move("new", 0, 2)]


def _run(rebalance: bool) -> Any:
    from sloserve.cluster.config import ClusterConfig
    from sloserve.config import validate
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.runner import SimConfig

    cfg = validate(
        SimConfig,
        {"instance": {"profile": "llama-2-7b-a100", "max_running": 2}, "workload": {}},
        "test",
    )
    cluster = ClusterConfig.load(
        {
            "replicas": [{"count": 2}],
            "router": "aladdin",
            "router_params": {
                "slo_ttft_ms": 1000,
                "slo_atgt_ms": 50,
                "mix": "fixed-100-50",  # the history predicts 50 output tokens
                "rebalance": rebalance,
                "tick_s": 0.25,
            },
        },
        "test",
    )
    # Two requests predicted at 50 tokens run 600; a third comes 0.3 s later.
    reqs = [Request(0, 0.0, 100, 600), Request(1, 0.1, 100, 600), Request(2, 0.3, 100, 50)]
    return simulate_cluster(cfg, cluster, reqs)


def test_rebalancing_prevents_the_slo_miss_placement_alone_suffers() -> None:
    alone, rebalanced = _run(False), _run(True)
    a = alone.table.set_index("req_id")
    r = rebalanced.table.set_index("req_id")
    # Best fit packs all three on replica 0; its two slots are held by the long requests,
    # so the third waits there until one ends (seconds): a TTFT miss.
    assert (a["replica"] == 0).all()
    assert a.loc[2, "ttft_s"] > 1.0
    # Re-balancing sees replica 0's requests outlive their prediction and moves the
    # waiting one to replica 1 before it starts: within the 1 s TTFT.
    assert r.loc[2, "replica"] == 1 and r.loc[2, "ttft_s"] < 1.0
    assert (r.loc[[0, 1], "replica"] == 0).all()
    assert (r["status"] == "finished").all() and len(r) == 3


@pytest.mark.parametrize("started", [True, False])
def test_reroute_moves_only_an_unstarted_request(started: bool) -> None:
    from sloserve.cluster import Cluster
    from sloserve.cluster.controller import Reroute
    from sloserve.cluster.replica import ReplicaSpec
    from sloserve.cluster.routing import make_router
    from sloserve.engine.env import Environment
    from sloserve.experiments.runner import InstanceConfig, SimConfig, build_instance

    cfg = SimConfig(instance=InstanceConfig(cost_model="constant:0.01"))
    env = Environment()
    specs = [ReplicaSpec(i, 0, "p", "vllm", "m", 0.0) for i in range(2)]
    clu = Cluster(
        env,
        specs,
        lambda s, i: build_instance(cfg, env, instance_id=i),
        make_router("round-robin", {}),  # first routing: replica 0, the next: replica 1
    )
    req = Request(0, 0.0, 100, 5, model="m")
    clu.add_request(req)
    if started:
        env.step()  # replica 0's first iteration: the request is admitted and runs
    clu._apply([Reroute(1, 0), Reroute(0, 0)])  # the first names the wrong replica: no-op
    env.run()
    assert not clu.close(env.now) and clu.ended == {0: req}
    assert req.status is RequestStatus.FINISHED and req.num_failovers == 0
    assert req.instance_id == (0 if started else 1)
    assert len(req.token_iterations()) == 5


def test_a_preempted_request_is_not_withdrawn() -> None:
    from sloserve.cluster.replica import Replica, ReplicaSpec
    from sloserve.engine.env import Environment
    from sloserve.experiments.runner import InstanceConfig, SimConfig, build_instance

    env = Environment()
    rep = Replica(ReplicaSpec(0, 0, "p", "vllm", "m", 0.0))
    rep.instance = build_instance(
        SimConfig(instance=InstanceConfig(cost_model="constant:0.01")), env
    )
    req = Request(7, 0.0, 100, 5, model="m")
    req.start(0.0)
    req.preempt_recompute(0.1)  # it ran and was evicted: back in the queue, not new
    rep.instance.waiting.append(req)
    assert rep.withdraw_unstarted(7) is None and rep.instance.waiting == [req]
    fresh = Request(8, 0.0, 100, 5, model="m")
    rep.instance.waiting.append(fresh)
    assert rep.withdraw_unstarted(8) is fresh and rep.instance.waiting == [req]
