"""The round-robin baseline (BROS §2.2): RT and BE classes take turns per iteration."""

from __future__ import annotations

import pytest

from helpers import make_instance, req, run
from sloserve.core.errors import ConfigError
from sloserve.core.request import RequestClass
from sloserve.policies.registry import make_policy, policy_summaries

BE = RequestClass.BE


def test_classes_alternate_iterations() -> None:
    inst = make_instance("rr", multi_step=False)
    rt, be = req(0, 0.0, 8, 6), req(1, 0.0, 8, 6, req_class=BE)
    run(inst, [rt, be])
    assert rt.is_finished and be.is_finished
    rt_iters, be_iters = rt.token_iterations(), be.token_iterations()
    # RT's turn first (prefill), then BE's, then alternating decodes: never together.
    assert rt_iters == [0, 2, 4, 6, 8, 10]
    assert be_iters == [1, 3, 5, 7, 9, 11]
    # vLLM runs both in every iteration.
    v = make_instance("vllm", multi_step=False)
    a, b = req(0, 0.0, 8, 6), req(1, 0.0, 8, 6, req_class=BE)
    run(v, [a, b])
    assert a.token_iterations() == b.token_iterations() == [0, 1, 2, 3, 4, 5]


def test_idle_class_gives_its_turn_away() -> None:
    inst = make_instance("rr", multi_step=False)
    rt, be = req(0, 0.0, 8, 3), req(1, 0.0, 8, 10, req_class=BE)
    run(inst, [rt, be])
    # once RT is done BE runs every iteration
    assert be.token_iterations() == [1, 3, 5, 6, 7, 8, 9, 10, 11, 12]


def test_single_class_is_vllm_with_the_fast_path() -> None:
    reqs = [req(i, 0.1 * i, 30 + i, 40 - i) for i in range(8)]
    inst = run(make_instance("rr"), reqs)
    ref = [req(i, 0.1 * i, 30 + i, 40 - i) for i in range(8)]
    v = run(make_instance("vllm"), ref)
    assert [r.finish_time for r in reqs] == [r.finish_time for r in ref]
    assert len(inst.trace.time) == len(v.trace.time)  # same number of decisions (fast path)


def test_rr_registered_and_validated() -> None:
    assert "rr" in policy_summaries()
    assert make_policy("rr", {"first": "be", "base": "sarathi"}).describe()["first"] == "be"
    with pytest.raises(ConfigError, match="first"):
        make_policy("rr", {"first": "x"})
    with pytest.raises(ConfigError, match="base"):
        make_policy("rr", {"base": "edf"})
    with pytest.raises(ConfigError, match="unknown parameter"):
        make_policy("rr", {"turn": 1})


def test_the_other_class_counts_toward_r_max() -> None:
    inst = make_instance("rr", R_max=2, multi_step=False)
    reqs = [req(0, 0.0, 8, 20, req_class=BE), req(1, 0.0, 8, 20, req_class=BE)]
    reqs += [req(2, 0.005, 8, 3), req(3, 0.005, 8, 3)]
    run(inst, reqs)  # would raise SchedulerViolation if RT admitted past R_max
    assert all(r.is_finished for r in reqs)
    assert max(inst.trace.running) <= 2
