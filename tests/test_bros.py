"""BROS (§4): RT ranking by residual time, BE packing/replacement, adaptive batch size,
and the end-to-end claim on a hybrid workload."""

from __future__ import annotations

import pytest

from helpers import make_instance, req, run
from sloserve.core.errors import ConfigError
from sloserve.core.request import SLO, RequestClass
from sloserve.policies.bros import BROSScheduler
from sloserve.policies.registry import make_policy, policy_summaries

BE = RequestClass.BE


def test_registered_with_params() -> None:
    names = policy_summaries()
    assert {"bros", "bros-nobicache", "rr"} <= set(names)
    nb = make_policy("bros-nobicache")
    assert isinstance(nb, BROSScheduler) and nb.config.bidirectional is False
    assert nb.drop_mode.value == "recompute"
    assert make_policy("bros", {"batch_base": 8}).describe()["batch_base"] == 8
    with pytest.raises(ConfigError, match="unknown parameter"):
        make_policy("bros", {"batch": 8})
    with pytest.raises(ConfigError, match="batch_base"):
        make_policy("bros", {"batch_base": 0})
    with pytest.raises(ConfigError, match="preemption_mode"):
        make_policy("bros", {"preemption_mode": "drop"})
    assert make_policy("bros", {"preemption_mode": "recompute"}).describe()["order"] == "fcfs"


def test_most_urgent_rt_first() -> None:
    # Batch size 1: one request per iteration, in order of residual time to the TTFT target.
    params = {"batch_base": 1, "adaptive_batch": False}
    inst = make_instance("bros-nobicache", params=params, multi_step=False)
    reqs = [req(i, 0.0, 4, 1, slo=SLO(ttft_s=t)) for i, t in enumerate((0.5, 0.1, 0.3))]
    run(inst, reqs)
    assert [r.first_token_time for r in reqs] == pytest.approx([0.03, 0.01, 0.02])


def test_tpot_deadline_outranks_a_later_ttft() -> None:
    # a decodes with TPOT 0.015 s; b arrives with TTFT 1 s: a keeps its pace, b waits.
    params = {"batch_base": 1, "adaptive_batch": False}
    inst = make_instance("bros-nobicache", params=params, multi_step=False)
    a = req(0, 0.0, 4, 5, slo=SLO(ttft_s=0.1, tpot_s=0.015))
    b = req(1, 0.005, 4, 1, slo=SLO(ttft_s=1.0))
    run(inst, [a, b])
    assert a.finish_time == pytest.approx(0.05)
    assert b.first_token_time == pytest.approx(0.06)


def test_batch_size_doubles_without_rt_and_resets_on_a_predicted_miss() -> None:
    sched = make_policy("bros", {"batch_base": 2})
    assert isinstance(sched, BROSScheduler)
    inst = make_instance(sched, multi_step=False)
    be = [req(i, 0.0, 4, 4, req_class=BE) for i in range(8)]
    run(inst, be)
    assert sched.batch_size > 2
    # BE only: batches of 2, 4, 8 (decodes count): 2 + 2 + 4 prefills in 3 iterations
    assert sorted(r.first_token_time for r in be) == pytest.approx(
        [0.01] * 2 + [0.02] * 2 + [0.03] * 4
    )
    big = sched.batch_size
    # Two RT requests whose TTFT (5 ms) is shorter than an iteration (10 ms): the second
    # cannot fit T_min^res -> predicted miss -> back to B_base.
    rt = [req(10 + i, 1.0, 4, 2, slo=SLO(ttft_s=0.005)) for i in range(2)]
    run(inst, rt)
    assert big >= 8 and sched.batch_size < big and sched.predicted_misses >= 1
