"""QLM end to end on a deterministic cost model (every iteration 10 ms, every request
100 prompt and 50 output tokens, a 0.1 s burst of 40 requests on two replicas running
at most 4 requests each): when the plan generator is called and reports every plan
feasible, every deadline is met in the simulation; when it reports a plan infeasible,
some deadline is missed. The be half has a 60 s deadline, the rt half the one under test.

Only runs whose plan generator was called count: a group whose placement meets its
deadline at level α is not planned at all, and that estimate is the RCT estimator's,
not the plan's (its accuracy is reported as ``rct_r2``)."""

from __future__ import annotations

from typing import Any

import pytest

import sloserve


def _run(rt_deadline_s: float) -> dict[str, Any]:
    cfg = {
        "workload": {
            "arrival": {"kind": "constant", "rate": 400},
            "duration_s": 0.1,
            "prompt": {"kind": "fixed", "value": 100},
            "output": {"kind": "fixed", "value": 50},
            "classes": {"rt": 0.5, "be": 0.5},
            "slo": {"rt": {"deadline_s": rt_deadline_s}, "be": {"deadline_s": 60}},
            "seed": 0,
        },
        "instance": {"cost_model": "constant:0.01", "max_running": 4},
    }
    params = {
        "output_mean": 50, "output_std": 1, "replan_interval_s": 0,
        "avg_batch_size": 4, "group_size_factor": 1,
    }  # fmt: skip
    run = sloserve.simulate(
        cfg,
        policy="qlm",
        cluster={"replicas": [{"count": 2}], "router": "qlm", "router_params": params},
    )
    s: dict[str, Any] = run.summary
    assert s["finished"] == s["requests"] == 40
    return s


@pytest.mark.parametrize("rt_deadline_s", [1.7, 2.0])
def test_a_feasible_plan_meets_every_deadline(rt_deadline_s: float) -> None:
    s = _run(rt_deadline_s)
    q = s["qlm"]
    assert q["plan_calls"] >= 1 and q["plans_predicting_violations"] == 0
    assert s["deadline_attainment"] == 1.0


@pytest.mark.parametrize("rt_deadline_s", [0.6, 1.0])
def test_an_infeasible_plan_is_followed_by_a_missed_deadline(rt_deadline_s: float) -> None:
    s = _run(rt_deadline_s)
    assert s["qlm"]["plans_predicting_violations"] >= 1
    assert s["deadline_attainment_by_class"]["rt"] < 1.0
    assert s["deadline_attainment_by_class"]["be"] == 1.0
