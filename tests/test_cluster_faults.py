"""Failures and recoveries: conservation (hypothesis), evacuation, and bad cluster configs."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sloserve.cluster import ClusterConfig
from sloserve.core.errors import ConfigError, UnknownNameError
from sloserve.core.request import Request, RequestStatus
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.runner import InstanceConfig, SimConfig
from sloserve.workloads import FixedLength, PoissonArrivals, UniformLength, WorkloadSpec

_CFG = SimConfig(
    workload=WorkloadSpec(
        arrival=PoissonArrivals(rate=40),
        duration_s=2.0,
        seed=11,
        prompt=UniformLength(low=16, high=400),
        output=UniformLength(low=4, high=120),
    ),
    instance=InstanceConfig(max_running=16, kv_capacity_tokens=6000),
    horizon_s=30.0,
)

_failure = st.tuples(
    st.integers(0, 2),
    st.floats(0.0, 3.0, allow_nan=False),
    st.one_of(st.none(), st.floats(0.01, 2.0, allow_nan=False)),
)


@settings(
    max_examples=24, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    failures=st.lists(_failure, max_size=5),
    policy=st.sampled_from(["vllm", "vllm-swap", "sarathi", "andes"]),
    router=st.sampled_from(["round-robin", "least-outstanding", "jsq-tokens", "slo-aware"]),
    disaggregated=st.booleans(),
)
def test_every_request_ends_exactly_once_under_random_failures(
    failures: list[tuple[int, float, float | None]],
    policy: str,
    router: str,
    disaggregated: bool,
) -> None:
    # Disaggregated: 1 prefill + 2 decode replicas over a slow link (up to 0.2 s a
    # transfer), so that failures also hit requests in transfer.
    cc = ClusterConfig(
        replicas=[{"role": "prefill"}, {"role": "decode", "count": 2}]
        if disaggregated
        else [{"count": 3}],
        transfer={"kv_link_gb_per_s": 1.0},
        router=router,
        failures=[
            {"replica": r, "at_s": at, "recover_s": None if d is None else at + d}
            for r, at, d in failures
        ],
    )
    params = {"preemption_mode": "swap"} if policy == "vllm-swap" else {}
    cfg = _CFG.model_copy(update={"policy": policy.removesuffix("-swap"), "policy_params": params})
    res = simulate_cluster(cfg, cc, check_invariants=True)
    t = res.table
    n_in = len({r.req_id for r in res.requests})
    assert n_in == len(res.requests) == len(t)  # no duplicate, none lost
    assert (
        res.summary["requests"]
        == res.summary["finished"] + res.summary["aborted"] + res.summary["rejected"]
    )
    assert all(r.status.is_terminal for r in res.requests)
    done = t[t["status"] == "finished"]
    assert (done["generated_tokens"] == done["output_tokens"]).all()
    for r in res.requests:
        if r.status is RequestStatus.FINISHED:
            assert res.timeline(r.req_id)["delivered_s"].is_monotonic_increasing
            assert len(res.timeline(r.req_id)) == r.true_output_len
    aborted = t[t["status"] == "aborted"]
    assert (aborted["abort_reason"] != "").all()


def test_request_model_routing_and_unserved_model() -> None:
    cfg = SimConfig(instance=InstanceConfig(cost_model="constant:0.01"))
    reqs = [
        Request(
            req_id=i,
            arrival=0.01 * i,
            num_prompt_tokens=20,
            true_output_len=5,
            model="m1" if i % 2 else "m2",
        )
        for i in range(10)
    ]
    cc = ClusterConfig(
        replicas=[{"count": 1, "model": "m1"}, {"count": 2, "model": "m2"}],
        router="least-outstanding",
    )
    res = simulate_cluster(cfg, cc, reqs)
    t = res.table
    assert (t[t["model"] == "m1"]["replica"] == 0).all()
    assert set(t[t["model"] == "m2"]["replica"]) == {1, 2}
    assert set(res.summary["slo_attainment_by_model"]) == {"m1", "m2"}
    with pytest.raises(ConfigError, match="'m2' is served by no replica"):
        simulate_cluster(cfg, ClusterConfig(replicas=[{"model": "m1"}]), reqs)


@pytest.mark.parametrize(
    ("cluster", "match"),
    [
        ({"replicas": [{"count": 0}]}, "replicas.0.count"),
        ({"router": "nope"}, "unknown router 'nope'"),
        ({"router_params": {"x": 1}, "router": "random"}, "router 'random': unknown parameter"),
        ({"replicas": [{"profile": "no-such-profile"}]}, "replicas.0.profile: .*no-such-profile"),
        ({"replicas": [{"policy": "vlm"}]}, "replicas.0.policy: unknown policy .vlm."),
        ({"failures": [{"replica": 3, "at_s": 1.0}]}, "failures.0.replica: 3 out of range"),
        ({"failures": [{"replica": 0, "at_s": 99.0}]}, "failures.0.at_s: 99.0 outside the run"),
        ({"drains": [{"replica": 0, "at_s": 50.0}]}, "drains.0.at_s: 50.0 outside the run"),
        (
            {"failures": [{"replica": 0, "at_s": 2.0, "recover_s": 1.0}]},
            "recover_s: 1.0 is not after",
        ),
        ({"replicas": [{"count": 2, "start_s": 40}]}, "start_s: 40.0 is not before the horizon"),
        ({"bogus": 1}, "unknown key 'bogus'"),
    ],
)
def test_bad_cluster_configs_are_one_line_errors(cluster: dict, match: str) -> None:
    cfg = SimConfig(horizon_s=30.0)
    with pytest.raises(ConfigError, match=match) as e:
        simulate_cluster(cfg, ClusterConfig.load(cluster))
    assert "\n" not in str(e.value)
    assert isinstance(e.value, ConfigError)
    if "unknown router" in match:
        assert isinstance(e.value, UnknownNameError)


def test_fixed_length_long_run_has_no_loss_with_failures_and_drains() -> None:
    cfg = SimConfig(
        workload=WorkloadSpec(
            arrival=PoissonArrivals(rate=30),
            duration_s=5,
            seed=2,
            prompt=FixedLength(value=256),
            output=FixedLength(value=64),
        ),
        policy="sarathi",
    )
    cc = ClusterConfig(
        replicas=[{"count": 2}, {"count": 1, "start_s": 2.0, "policy": "vllm"}],
        router="slo-aware",
        failures=[{"replica": 0, "at_s": 1.0, "recover_s": 3.0}, {"replica": 2, "at_s": 4.0}],
        drains=[{"replica": 1, "at_s": 3.5}],
    )
    s = simulate_cluster(cfg, cc, check_invariants=True).summary
    assert s["finished"] == s["requests"]
    assert s["failovers"] > 0
    assert s["policy"] == "sarathi+vllm"
    assert [r["status"] for r in s["replicas"]] == ["up", "left", "failed"]
