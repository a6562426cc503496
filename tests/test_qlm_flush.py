"""QLM's ``swap: flush`` (``cluster/qlm/flush.py``): a model change gives the replica's
requests back to QLM's queues, its load starts at once, and every request ends once."""

import dataclasses
from typing import Any

import pytest

from sloserve.cluster import lifecycle
from sloserve.cluster.qlm import make_qlm_router
from sloserve.core.errors import ConfigError
from sloserve.core.request import RequestStatus


def _run_wa(swap: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[tuple[str, int]]]:
    """A short multi-model W_A (the quick plan's qlm run, 20 s of arrivals) under ``swap``;
    with, per model change the cluster applied, the replica's status and requests held."""
    from sloserve.cluster.config import ClusterConfig
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.qlm.plan import TAIL_SHARE, Plan
    from sloserve.experiments.runner import SimConfig

    run = next(
        r
        for r in Plan.quick().runs
        if r.workload == "W_A" and r.system == "qlm" and r.tail_share == TAIL_SHARE
    )
    run = dataclasses.replace(run, swap=swap, duration_s=20.0)
    changes: list[tuple[str, int]] = []
    orig = lifecycle.change_model

    def change_model(clu: Any, rep: Any, model: str) -> None:
        if model != rep.spec.model:
            changes.append((rep.status.name, rep.holds))
        orig(clu, rep, model)

    monkeypatch.setattr(lifecycle, "change_model", change_model)
    sim, cluster = run.config()
    cfg = SimConfig.model_validate(sim)
    res = simulate_cluster(cfg, ClusterConfig.load(cluster, "flush test"), None)
    return res, changes


@pytest.mark.parametrize("swap", ["drain", "flush"])
def test_model_changes_flush_or_drain_and_every_request_ends_once(
    swap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    res, changes = _run_wa(swap, monkeypatch)
    s = res.summary
    ids = [r.req_id for r in res.requests]
    assert len(ids) == len(set(ids)) == s["requests"] > 0
    # every request ended (finished, rejected at admission or aborted), none left in a queue
    assert all(r.status.is_terminal for r in res.requests)
    assert sum(r.status is RequestStatus.FINISHED for r in res.requests) == s["finished"]
    assert s["finished"] >= 0.9 * s["requests"]
    q = s["qlm"]
    up = [held for status, held in changes if status == "UP"]
    assert up, "the run must change models"
    if swap == "flush":
        assert q["flushes"] > 0 and q["flushed_requests"] > 0
        assert s["failovers"] >= q["flushed_requests"]
        # the replica is empty when its change is applied (the load starts at once),
        # except a change drained by the progress rule (flush.py): nothing finished on
        # the replica since its last change
        assert sum(held > 0 for held in up) <= q["flush_drains"] < len(up)
    else:
        assert q["flushes"] == 0 and s["failovers"] == 0 and q["flush_drains"] == 0
        assert any(held > 0 for held in up)  # a drain: changes wait for what is held


def test_bad_swap_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"router_params\.swap"):
        make_qlm_router("qlm", swap="evict")
    assert make_qlm_router("qlm").swap == "drain"


def test_no_flush_inside_a_finish_of_the_replicas_own_request() -> None:
    """A request's finish is delivered while its replica retires the iteration's batch; a
    flush (Requeue) of that replica then emptied it under the loop and the engine's retire
    failed (the quick W_A at seed 2 under flush). It now waits for the next event or tick
    (``flush.flush_waits``); the run ends with every request ended once."""
    from sloserve.cluster.config import ClusterConfig
    from sloserve.experiments.cluster_run import simulate_cluster
    from sloserve.experiments.qlm.plan import TAIL_SHARE, Plan
    from sloserve.experiments.runner import SimConfig

    run = next(
        r
        for r in Plan.quick(2).runs
        if r.workload == "W_A" and r.system == "qlm" and r.tail_share == TAIL_SHARE
    )
    sim, cluster = dataclasses.replace(run, swap="flush").config()
    res = simulate_cluster(
        SimConfig.model_validate(sim), ClusterConfig.load(cluster, "flush test"), None
    )
    assert res.summary["qlm"]["flushes"] > 0
    ids = [r.req_id for r in res.requests]
    assert len(ids) == len(set(ids)) and all(r.status.is_terminal for r in res.requests)


def test_flush_waits_only_for_the_replica_whose_request_is_finishing() -> None:
    from types import SimpleNamespace

    from sloserve.cluster.qlm.flush import flush_waits

    qr = make_qlm_router("qlm", swap="flush")
    busy = SimpleNamespace(replica_id=0, outstanding=3)
    assert not flush_waits(qr, busy)  # type: ignore[arg-type]
    qr._retiring = 0
    assert flush_waits(qr, busy)  # type: ignore[arg-type]
    assert not flush_waits(qr, SimpleNamespace(replica_id=1, outstanding=3))  # type: ignore[arg-type]
    assert not flush_waits(qr, SimpleNamespace(replica_id=0, outstanding=0))  # type: ignore[arg-type]
    drain = make_qlm_router("qlm")
    drain._retiring = 0
    assert not flush_waits(drain, busy)  # type: ignore[arg-type]
