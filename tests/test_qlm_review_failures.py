"""Review (rqlm): QLM under replica failures that hit a model change, or a recovery.

Both failed before the fixes in ``router.py`` (B1: a failure forgets the change under way;
B2: a replica with no virtual queue makes the router re-plan)."""

from __future__ import annotations

from typing import Any

from sloserve.cluster.config import ClusterConfig
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.qlm.plan import Run
from sloserve.experiments.qlm.reproduce import _workload
from sloserve.experiments.runner import SimConfig


def _finished(run: Run, failures: list[dict[str, Any]]) -> int:
    sim, cluster = run.config()
    cluster["failures"] = failures
    cfg = SimConfig.model_validate(sim)
    res = simulate_cluster(cfg, ClusterConfig.load(cluster, "review"), _workload(cfg, run))
    return sum(1 for r in res.requests if r.is_finished)


def test_a_half_second_failure_during_a_model_change_strands_no_request() -> None:
    """Replica 0 fails at 5.0 s while changing to phi-2 and is back at 5.5 s. The cluster
    cancels the change (``lifecycle.fail``), but the router keeps ``_changing[0] = 'phi-2'``,
    so ``warm_start`` never issues the change again (``pending == head.model``)."""
    run = Run("W_A", "qlm", 0.5, 14.0, 40.0, 0)
    healthy = _finished(run, [])
    assert _finished(run, [{"replica": 0, "at_s": 5.0, "recover_s": 5.5}]) >= healthy - 3


def test_a_recovered_replica_takes_back_work_after_arrivals_end() -> None:
    """Replica 0 (Mistral-7B) fails twice and is back, idle, at 75 s; 36 Mistral-7B
    requests then wait in replica 1's virtual queue (draining a Llama-2-70B request) until
    the 160 s horizon: a recovery sets nothing dirty, and no arrival comes to re-plan."""
    run = Run("W_A_large", "qlm", 0.5, 7.0, 40.0, 0)
    fails = [
        {"replica": 0, "at_s": 30.0, "recover_s": 45.0},
        {"replica": 0, "at_s": 70.0, "recover_s": 75.0},
    ]
    assert _finished(run, fails) >= _finished(run, []) - 3


def test_flush_with_one_replica_left_does_not_alternate_models_forever() -> None:
    """B5: W_A_large at seed 0 under ``swap: flush``, replica 0 down for good at 5 s. The
    survivor flushed its batch at every change and alternated Llama-2-70B and Mistral-7B
    every 4 s from 73 s to the 160 s horizon (190 requests unfinished, 104 under drain).
    A replica that has finished nothing since its last change now drains (``flush.py``)."""
    fails = [{"replica": 0, "at_s": 5.0}]
    flush = Run("W_A_large", "qlm", 0.5, 7.0, 40.0, 0, swap="flush")
    drain = Run("W_A_large", "qlm", 0.5, 7.0, 40.0, 0)
    assert _finished(flush, fails) >= _finished(drain, fails) - 3
