"""QLM's parts on hand-checkable cases: request groups (Alg. 1), the RCT estimator (§6),
the plan generator (§7) against brute force, and the per-replica agent's swap choice."""

from __future__ import annotations

import itertools
import math

import pytest

from helpers import make_instance
from sloserve.cluster.qlm import (
    GroupingConfig,
    GroupTable,
    HardwareProfile,
    OutputLengthModel,
    PlanGroup,
    PlannerConfig,
    PlanQueue,
    RCTEstimator,
    generate_plan,
    profile_instance,
)
from sloserve.cluster.qlm.plan import simulate_plan
from sloserve.cluster.qlm.rct import r_squared
from sloserve.cluster.view import RouteRequest
from sloserve.core.errors import ConfigError
from sloserve.core.request import SLO, Request
from sloserve.costmodel.base import ConstantCostModel
from sloserve.policies.registry import make_policy


def _rr(
    i: int, prompt: int = 100, model: str = "m", deadline: float = 30.0, arrival: float = 0.0
) -> RouteRequest:
    return RouteRequest(i, model, prompt, arrival, SLO(deadline_s=deadline))


def test_groups_form_by_key_and_split_at_factor_times_batch() -> None:
    t = GroupTable(GroupingConfig(group_size_factor=0.5, avg_batch_size=4))  # max size 2
    gs = [t.add(_rr(i, arrival=float(i))) for i in range(5)]
    assert [g.group_id for g in gs] == [0, 0, 1, 1, 2]
    assert [r.req_id for r in gs[0].requests] == [0, 1]  # FCFS inside a group
    assert (gs[0].deadline, gs[2].deadline, gs[4].deadline) == (30.0, 32.0, 34.0)
    other = [t.add(_rr(10, deadline=300.0)), t.add(_rr(11, model="x")), t.add(_rr(12, prompt=5000))]
    assert len({g.group_id for g in other} | {0, 1, 2}) == 6
    assert t.add(_rr(0)) is gs[0]  # idempotent
    t.remove(0)
    t.remove(1)
    assert 0 not in t.groups and len(t) == 5


@pytest.mark.parametrize(
    "kw", [{"group_size_factor": 0.0}, {"group_size_factor": -1.0}, {"avg_batch_size": 0}]
)
def test_bad_grouping_is_an_error(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=next(iter(kw))):
        GroupingConfig(**kw)  # type: ignore[arg-type]


def test_rct_formulas_on_a_hand_computed_group() -> None:
    hw = HardwareProfile(0.001, 0.01, 100.0, 2.0)
    est = RCTEstimator(OutputLengthModel(100.0, 10.0, 1.0), alpha=0.5)
    g = GroupTable(GroupingConfig()).add(_rr(0))
    for i in (1, 2):
        g.requests.append(_rr(i))
    # work: 3 outputs of 100 tokens at 100 tok/s + 300 prompt tokens at 1 ms
    assert est.work(g, hw) == pytest.approx((3.3, 0.03))
    # last request: waits for 2 others (2 s), prefill 0.1 s, decode 100 × 10 ms × 2
    assert est.completion(g, hw) == pytest.approx((4.1, 0.02 + 0.04))
    assert est.quantile(4.1, 0.06) == pytest.approx(4.1)  # alpha 0.5: the mean
    assert RCTEstimator(est.lengths, 0.9).quantile(4.1, 0.06) == pytest.approx(
        4.1 + 1.2815515655 * math.sqrt(0.06)
    )
    with pytest.raises(ConfigError, match="alpha"):
        RCTEstimator(est.lengths, 1.0)


def test_output_lengths_are_fitted_online_from_the_prior() -> None:
    m = OutputLengthModel(100.0, 0.0, 0.0)
    key = GroupTable(GroupingConfig()).key_of(_rr(0))
    assert m.params(key) == (100.0, 0.0)
    for n in (10, 20, 30):
        m.observe(key, n)
    mu, sd = m.params(key)
    assert mu == pytest.approx(20.0) and sd == pytest.approx(math.sqrt(200 / 3))
    blended = OutputLengthModel(100.0, 0.0, 3.0)
    for n in (10, 20, 30):
        blended.observe(key, n)
    assert blended.params(key)[0] == pytest.approx(60.0)  # half prior, half data
    assert r_squared([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0


def test_profile_of_a_batch_on_a_constant_cost_model() -> None:
    inst = make_instance("vllm", cost=ConstantCostModel(0.01))
    hw = profile_instance(inst, batch=4, prompt=10, output=5)
    # one prefill iteration (token 1), then 4 decode iterations: 20 tokens in 0.05 s
    assert hw.throughput_tokens_per_s == pytest.approx(400.0)
    assert hw.prefill_s_per_token == pytest.approx(0.01 / 40)
    assert hw.decode_s_per_token == pytest.approx(0.01)
    assert hw.inefficiency == pytest.approx(1.0)


def _brute_force(groups: list[PlanGroup], queues: list[PlanQueue]) -> float:
    """Least total completion over every assignment and order that meets every deadline."""
    best = math.inf
    ids = [g.gid for g in groups]
    for perm in itertools.permutations(ids):
        for cut in itertools.product(range(len(queues)), repeat=len(ids)):
            order = {
                q.rid: [g for g, c in zip(perm, cut, strict=True) if c == k]
                for k, q in enumerate(queues)
            }
            comp = simulate_plan(groups, queues, order)
            if all(comp[g.gid] <= g.deadline + 1e-9 for g in groups):
                best = min(best, sum(comp.values()))
    return best


def _tiny() -> tuple[list[PlanGroup], list[PlanQueue]]:
    groups = [
        PlanGroup(0, "a", 9.0, (2.0, 3.0), (2.5, 3.5)),
        PlanGroup(1, "b", 6.0, (1.0, 1.5), (1.5, 2.0)),
        PlanGroup(2, "a", 5.0, (1.0, 1.0), (1.2, 1.2)),
        PlanGroup(3, "b", 12.0, (3.0, 2.0), (3.0, 2.5)),
    ]
    queues = [PlanQueue(0, "a", 0.5, 2.0), PlanQueue(1, "b", 0.0, 2.0)]
    return groups, queues


def test_the_plan_on_a_tiny_instance_equals_brute_force() -> None:
    groups, queues = _tiny()
    plan = generate_plan(groups, queues, PlannerConfig(time_limit_s=10))
    assert plan.method == "milp" and plan.feasible
    assert sorted(g for q in plan.queues.values() for g in q) == [0, 1, 2, 3]
    assert sum(plan.completion.values()) == pytest.approx(_brute_force(groups, queues))
    assert all(plan.completion[g.gid] <= g.deadline + 1e-9 for g in groups)


def test_infeasible_plans_fall_back_to_edf_and_large_ones_use_the_heuristic() -> None:
    groups, queues = _tiny()
    late = [PlanGroup(g.gid, g.model, 0.1, g.work, g.completion) for g in groups]
    plan = generate_plan(late, queues, PlannerConfig(time_limit_s=10))
    assert plan.method == "edf-fallback" and plan.status == "infeasible"
    assert not plan.feasible
    big = generate_plan(groups, queues, PlannerConfig(max_milp_vars=10))
    assert big.method == "heuristic" and big.feasible


def test_qlm_agent_swaps_only_when_cheaper_and_with_a_cpu_tier() -> None:
    slow_swap = ConstantCostModel(0.01, swap_s_per_token=1.0)
    free_swap = ConstantCostModel(0.01, swap_s_per_token=0.0)
    for cost, cpu, mode in (
        (free_swap, 1000, "swap"),
        (free_swap, 0, "recompute"),
        (slow_swap, 1000, "recompute"),
    ):
        inst = make_instance("qlm", cost=cost, cpu_blocks=cpu, M=200)
        for i in range(4):
            inst.add_request(
                Request(
                    req_id=i,
                    arrival=0.0,
                    num_prompt_tokens=20,
                    true_output_len=80,
                    slo=SLO(deadline_s=10.0 - i),
                )
            )
        inst.env.run()
        assert inst.scheduler.config.preemption_mode.value == mode  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="state_swap"):
        make_policy("qlm", {"state_swap": "maybe"})
    with pytest.raises(ConfigError, match="unknown parameter"):
        make_policy("qlm", {"evictt": True})
