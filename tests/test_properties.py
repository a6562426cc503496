"""Invariants over random small workloads, every policy and random limits (hypothesis)."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import make_instance, req, run, small_linear_cost, times
from sloserve.core.request import SLO, QoESpec, RequestStatus
from sloserve.costmodel.base import ConstantCostModel
from sloserve.metrics.summary import request_table
from sloserve.policies.registry import policy_names

COSTS = {
    "constant": lambda: ConstantCostModel(0.01, swap_s_per_token=1e-4),
    "linear": small_linear_cost,
}

workloads = st.lists(
    st.tuples(st.floats(0, 2), st.integers(1, 60), st.integers(1, 40), st.floats(0.05, 5)),
    min_size=1,
    max_size=14,
)
setups = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(policy_names()),
        "M": st.integers(40, 400),
        "C": st.integers(16, 256),
        "R_max": st.integers(1, 8),
        "block_size": st.sampled_from([1, 4, 16]),
        "cost": st.sampled_from(sorted(COSTS)),
        "swap": st.booleans(),
        "predictor": st.sampled_from(["oracle", "constant:8", "constant:300"]),
        "watermark": st.sampled_from([0.0, 0.01, 0.1]),
        "order": st.sampled_from([None, "fcfs", "priority", "input"]),
    }
)


UNIFIED_ONLY = {"andes", "lqsf", "qlm"}  # these have their own parameters


def build(setup: dict, multi_step: bool = True):
    params: dict = {}
    if setup["policy"] not in UNIFIED_ONLY:
        params["watermark"] = setup["watermark"]
        if setup["order"] is not None:
            params["order"] = setup["order"]
    if setup["swap"] and setup["policy"] != "qlm":  # QLM's agent chooses swap itself
        params["preemption_mode"] = "swap"
    return make_instance(
        setup["policy"],
        cost=COSTS[setup["cost"]](),
        M=setup["M"],
        C=setup["C"],
        R_max=setup["R_max"],
        block_size=setup["block_size"],
        cpu_blocks=16,
        params=params,
        multi_step=multi_step,
        predictor=setup["predictor"],
    )


def make_reqs(spec: list[tuple[float, int, int, float]]):
    arrivals = sorted(a for a, *_ in spec)
    return [
        req(
            i,
            arrivals[i],
            p,
            o,
            slo=SLO(ttft_s=ttft, tpot_s=0.05),
            qoe=QoESpec(ttft, 5.0),
            priority=i % 3,
        )
        for i, (_a, p, o, ttft) in enumerate(spec)
    ]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=workloads, setup=setups)
def test_engine_invariants(spec, setup) -> None:
    inst = build(setup)  # check_invariants=True: KV blocks conserved after every decision
    reqs = make_reqs(spec)
    run(inst, reqs)
    # every request ends exactly once, finished ones with exactly their output length
    assert sorted(r.req_id for r in inst.done) == [r.req_id for r in reqs]
    for r in reqs:
        assert r.status in (RequestStatus.FINISHED, RequestStatus.REJECTED)
        if r.status is RequestStatus.FINISHED:
            assert r.num_output_tokens == r.true_output_len
            t = times(inst, r)
            assert t.size == r.true_output_len
            assert np.all(np.diff(t) > 0) and t[0] > r.arrival
            assert r.finish_time == t[-1]
        else:
            # rejected only when it could never fit: KV of I+O-1 tokens, or a whole
            # (re)fill in one batch for policies without chunked prefill
            assert r.reject_reason
            assert r.num_prompt_tokens + r.true_output_len - 1 > inst._max_seq
    assert inst.kv.num_used_blocks == 0 and not inst.running and not inst.waiting
    # every batch within the limits C and R_max
    assert max(inst.trace.batch_tokens, default=0) <= setup["C"]
    assert max(inst.trace.running, default=0) <= setup["R_max"]
    table = request_table(reqs, {0: np.asarray(inst.iter_end)})
    q = table["qoe"].dropna()
    assert ((q >= 0) & (q <= 1)).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=workloads, setup=setups, horizon=st.none() | st.floats(0.05, 3.0))
def test_fast_path_equals_single_stepping_and_runs_are_deterministic(spec, setup, horizon) -> None:
    results = []
    for multi in (True, False, True):
        inst = build(setup, multi_step=multi)
        reqs = make_reqs(spec)
        if horizon is None:
            run(inst, reqs)
        else:
            for r in reqs:
                inst.env.schedule(r.arrival, lambda r=r, inst=inst: inst.add_request(r), 0)
            inst.env.schedule(horizon, lambda: None, 5)  # as the runner does
            inst.env.run(until=horizon)
            inst.abort_all()
        results.append(
            (
                [r.status for r in reqs],
                [r.num_preemptions for r in reqs],
                [times(inst, r) for r in reqs],
                len(inst.iter_end),
            )
        )
    (s1, p1, t1, n1), (s2, p2, t2, n2), (s3, p3, t3, n3) = results
    assert s1 == s2 == s3 and p1 == p2 == p3 and n1 == n2 == n3
    for a, b, c in zip(t1, t2, t3, strict=True):
        # the fast path adds and prices iterations exactly as single steps do: bit-identical
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
