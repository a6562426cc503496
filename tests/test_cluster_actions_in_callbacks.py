"""Controller actions returned while a replica is inside its own completion: the cluster
must carry them out without breaking the replica's batch retire (no request lost or
duplicated)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sloserve.cluster import ClusterConfig
from sloserve.cluster.controller import Action, Event, Requeue
from sloserve.cluster.routing import Router, register_router, router_names
from sloserve.cluster.view import ClusterView, ReplicaStatus, RouteRequest
from sloserve.core.request import Request
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.runner import InstanceConfig, SimConfig
from sloserve.workloads import WorkloadSpec

_CFG = SimConfig(
    policy="vllm",
    instance=InstanceConfig(cost_model="constant:0.01", profile="llama-2-7b-a100"),
    workload=WorkloadSpec(duration_s=1, seed=0),
)


class _RequeueOnFinish(Router):
    """Round-robin router that, on each of the first ``times`` finishes, asks for every
    replica's requests back (so the finishing replica is requeued inside its retire)."""

    name = "test-requeue-on-finish"
    tick_s: float | None = None
    wants_events = True

    def __init__(self, seed: int = 0, times: int = 3) -> None:
        self.turn = 0
        self.left = times

    def route(self, req: RouteRequest, view: ClusterView) -> int:
        ids = [r.replica_id for r in view.replicas() if r.status is ReplicaStatus.UP]
        self.turn += 1
        return ids[self.turn % len(ids)]

    def on_tick(self, now: float, view: ClusterView, queued: Mapping[str, int]) -> Sequence[Action]:
        return []

    def on_event(self, event: Event, view: ClusterView) -> Sequence[Action]:
        if event.kind != "finish" or self.left == 0:
            return []
        self.left -= 1
        return [Requeue(r.replica_id) for r in view.replicas()]


if _RequeueOnFinish.name not in router_names():
    register_router(_RequeueOnFinish.name, _RequeueOnFinish, "test only")


def _reqs(n: int) -> list[Request]:
    # staggered lengths: each finish comes while other requests are mid-batch
    return [
        Request(req_id=i, arrival=0.001 * i, num_prompt_tokens=50, true_output_len=5 + 3 * i)
        for i in range(n)
    ]


def test_requeue_of_the_replica_whose_request_just_finished() -> None:
    cc = ClusterConfig(replicas=[{"count": 2}], router=_RequeueOnFinish.name)
    res = simulate_cluster(_CFG, cc, _reqs(12))
    t = res.table
    assert sorted(t["req_id"]) == list(range(12))  # each request once
    assert set(t["status"]) == {"finished"}
    assert res.summary["failovers"] > 0  # the requeues did happen
