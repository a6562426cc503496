"""Cluster milestone 2: models and loads, admission, decision tracing, the autoscaler."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sloserve.cluster import ClusterConfig
from sloserve.cluster.models import GIB
from sloserve.core.errors import ConfigError
from sloserve.core.request import Request, RequestClass, RequestStatus
from sloserve.costmodel.catalog import model_spec
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.runner import InstanceConfig, SimConfig
from sloserve.workloads import PoissonArrivals, UniformLength, WorkloadSpec, build_requests

_CONST = SimConfig(
    instance=InstanceConfig(cost_model="constant:0.01", profile="llama-2-7b-a100"),
    workload=WorkloadSpec(duration_s=1, seed=0),
)
_M2 = {"m2": {"weights_gib": 10.0, "kv_bytes_per_token": 524288, "profile": "llama-2-7b-a100"}}
# 10 GiB from disk at 2 GB/s, then over one A100's 25 GB/s PCIe link
_LOAD_M2 = 10 * GIB / 2e9 + 10 * GIB / 25e9


def _req(i: int, at: float, model: str, **kw: object) -> Request:
    return Request(
        req_id=i, arrival=at, num_prompt_tokens=100, true_output_len=5, model=model, **kw
    )  # type: ignore[arg-type]


def test_model_swap_cost_appears_exactly_in_ttft() -> None:
    # replica 0 serves llama-2-7b, changes to m2 at t=1; an m2 request arriving at 1 waits
    # for the load, a llama-2-7b request at 0 is untouched; baseline: m2 served from the start
    reqs = [_req(0, 0.0, "llama-2-7b"), _req(1, 1.0, "m2")]
    cc = ClusterConfig(models=_M2, model_swaps=[{"replica": 0, "at_s": 1.0, "model": "m2"}])
    res = simulate_cluster(_CONST, cc, reqs)
    base = simulate_cluster(_CONST, ClusterConfig(models=_M2, replicas=[{"model": "m2"}]), reqs[1:])
    t = res.table.set_index("req_id")
    assert t.loc[0, "ttft_s"] == pytest.approx(0.01)
    assert base.table["ttft_s"].iloc[0] == pytest.approx(0.01)
    assert t.loc[1, "ttft_s"] - base.table["ttft_s"].iloc[0] == pytest.approx(_LOAD_M2, abs=1e-9)
    (load,) = res.summary["model_loads"]
    assert load["tier"] == "disk" and load["end_s"] - load["start_s"] == pytest.approx(_LOAD_M2)
    assert res.summary["replicas"][0]["model"] == "m2"


def test_swap_waits_for_held_requests_and_back_is_a_warm_start() -> None:
    # the swap at 0.02 waits for request 0 (5 iterations: ends at 0.05), then loads m2;
    # swapping back to llama-2-7b later loads from host memory (cpu tier)
    reqs = [_req(0, 0.0, "llama-2-7b"), _req(1, 0.03, "m2")]
    swaps = [
        {"replica": 0, "at_s": 0.02, "model": "m2"},
        {"replica": 0, "at_s": 20.0, "model": "llama-2-7b"},
    ]
    cc = ClusterConfig(models=_M2, model_swaps=swaps)
    res = simulate_cluster(_CONST.model_copy(update={"horizon_s": 60.0}), cc, reqs)
    t = res.table.set_index("req_id")
    assert t.loc[0, "status"] == "finished" and t.loc[0, "e2e_s"] == pytest.approx(0.05)
    assert t.loc[1, "ttft_s"] == pytest.approx(0.05 + _LOAD_M2 + 0.01 - 0.03)
    first, back = res.summary["model_loads"]
    assert first["start_s"] == pytest.approx(0.05)
    assert back["tier"] == "cpu"
    w = model_spec("llama-2-7b").weight_bytes
    assert back["end_s"] - back["start_s"] == pytest.approx(w / 25e9)


def test_cold_start_of_a_late_replica_and_opt_out() -> None:
    reqs = [_req(0, 5.0, "llama-2-7b")]
    cc = {"replicas": [{"count": 1, "start_s": 5.0}]}
    on = simulate_cluster(_CONST, ClusterConfig(**cc), reqs)
    off = simulate_cluster(_CONST, ClusterConfig(**cc, cold_start=False), reqs)
    w = model_spec("llama-2-7b").weight_bytes
    cold = w / 2e9 + w / 25e9
    assert on.table["ttft_s"].iloc[0] == pytest.approx(cold + 0.01)
    assert off.table["ttft_s"].iloc[0] == pytest.approx(0.01)
    assert on.summary["gpu_seconds"] == pytest.approx(cold + 0.05)  # loading is held time


def test_workload_models_draw_and_errors() -> None:
    w = WorkloadSpec(duration_s=20, seed=4, models={"llama-2-7b": 0.7, "llama-2-70b": 0.3})
    reqs = build_requests(w)
    share = sum(r.model == "llama-2-7b" for r in reqs) / len(reqs)
    assert 0.6 < share < 0.8
    assert [r.model for r in build_requests(w)] == [r.model for r in reqs]  # seeded
    cfg = SimConfig(workload=w, instance=InstanceConfig(cost_model="constant:0.01"))
    with pytest.raises(ConfigError, match=r"workload\.models: model 'llama-2-70b'"):
        simulate_cluster(cfg, ClusterConfig())
    res = simulate_cluster(
        cfg,
        ClusterConfig(
            replicas=[{"profile": "llama-2-7b-a100"}, {"profile": "llama-2-70b-a100x2"}],
            router="least-outstanding",
        ),
    )
    t = res.table
    assert set(t[t["model"] == "llama-2-70b"]["replica"]) == {1}
    assert set(res.summary["slo_attainment_by_model"]) == {"llama-2-7b", "llama-2-70b"}
    with pytest.raises(ValueError, match="model fractions"):
        WorkloadSpec(models={"a": 0.0})
    with pytest.raises(ConfigError, match=r"model_swaps\.0\.model"):
        simulate_cluster(
            _CONST, ClusterConfig(model_swaps=[{"replica": 0, "at_s": 0.5, "model": "nope"}])
        )


# ------------------------------------------------------------------------------ admission


def test_token_bucket_rejects_with_reason() -> None:
    reqs = [_req(i, 0.0, "default") for i in range(5)] + [_req(5, 2.0, "default")]
    cc = ClusterConfig(admission={"kind": "token-bucket", "rate": 1.0, "burst": 2})
    res = simulate_cluster(_CONST, cc, reqs)
    st_ = res.table.set_index("req_id")["status"]
    assert list(st_) == ["finished"] * 2 + ["rejected"] * 3 + ["finished"]
    assert res.summary["rejected_by_reason"] == {"rate_limited": 3}
    assert all(r.reject_reason == "rate_limited" for r in res.requests if r.req_id in (2, 3, 4))


def test_shed_drops_sheddable_first_and_never_critical() -> None:
    # one replica holding at most 1 running (max_outstanding=1: the rest wait in the global
    # queue); max_live=2: beyond it sheddable arrivals go, a critical one displaces the
    # lowest-priority sheddable request queued
    C, S, B = RequestClass.CRITICAL, RequestClass.SHEDDABLE, RequestClass.BATCH
    reqs = [
        _req(0, 0.0, "default", req_class=C, priority=0),
        _req(1, 0.001, "default", req_class=B, priority=3),
        _req(2, 0.002, "default", req_class=S, priority=2),
        _req(3, 0.003, "default", req_class=C, priority=0),
        _req(4, 0.004, "default", req_class=C, priority=0),
    ]
    cc = ClusterConfig(
        router="least-outstanding",
        router_params={"max_outstanding": 1},
        admission={"kind": "shed", "max_live": 2},
    )
    res = simulate_cluster(_CONST, cc, reqs)
    by = {r.req_id: r for r in res.requests}
    assert by[2].status is RequestStatus.REJECTED and by[2].reject_reason == "shed"
    assert by[1].reject_reason == "shed_displaced"  # batch: the lowest priority queued
    assert all(by[i].status is RequestStatus.FINISHED for i in (0, 3, 4))
    assert res.summary["rejected_by_reason"] == {"shed": 1, "shed_displaced": 1}
    assert set(res.summary["slo_attainment_by_class"]) == {"critical", "batch", "sheddable"}


@pytest.mark.parametrize(
    ("adm", "msg"),
    [
        ({"kind": "token-bucket", "rate": 0, "burst": 2}, "rate"),
        ({"kind": "token-bucket", "rate": 1}, "needs burst"),
        ({"kind": "shed"}, "needs max_live"),
        ({"kind": "always", "max_live": 3}, "takes no max_live"),
    ],
)
def test_admission_params_out_of_range(adm: dict[str, object], msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        ClusterConfig.load({"admission": adm})


# ------------------------------------------------------------------------------ decisions


def test_decisions_record_scores_and_do_not_change_routing() -> None:
    w = WorkloadSpec(arrival=PoissonArrivals(rate=30), duration_s=2, seed=2)
    cfg = SimConfig(workload=w, instance=InstanceConfig(cost_model="constant:0.01"))
    cc = ClusterConfig(replicas=[{"count": 3}], router="least-loaded")
    plain = simulate_cluster(cfg, cc)
    traced = simulate_cluster(cfg, cc.model_copy(update={"trace_decisions": True}))
    assert plain.decisions is None
    assert list(plain.table["replica"]) == list(traced.table["replica"])
    d = traced.decisions
    assert d is not None and len(d) == len(traced.table)
    assert list(d["pick"]) == list(traced.table.sort_values("req_id")["replica"])
    row = d.iloc[-1]
    assert len(row["score_outstanding"]) == len(row["candidates"]) == 3
    assert row["pick"] in row["candidates"]
    k = list(row["candidates"]).index(row["pick"])
    assert row["total"][k] == min(row["total"])
    assert (d["queue_s"] == 0).all()


def test_decisions_hold_and_queue_time() -> None:
    reqs = [_req(i, 0.0, "default") for i in range(3)]
    cc = ClusterConfig(
        router="least-outstanding", router_params={"max_outstanding": 1}, trace_decisions=True
    )
    d = simulate_cluster(_CONST, cc, reqs).decisions
    assert d is not None
    held = d[d["pick"] == -1]
    assert set(held["hold"]) == {"max_outstanding"}
    final = d[d["pick"] >= 0].set_index("req_id")
    assert final.loc[1, "queue_s"] == pytest.approx(0.05)  # request 0 ran 5 iterations
    assert final.loc[2, "queue_s"] == pytest.approx(0.10)


# ------------------------------------------------------------------------------ autoscaler

_SCALE = SimConfig(
    workload=WorkloadSpec(
        arrival=PoissonArrivals(rate=40),
        duration_s=3.0,
        seed=5,
        prompt=UniformLength(low=16, high=400),
        output=UniformLength(low=4, high=120),
    ),
    instance=InstanceConfig(max_running=8, kv_capacity_tokens=6000),
    horizon_s=60.0,
)


def test_autoscaler_adds_then_removes_and_accounts_gpu_seconds() -> None:
    cc = ClusterConfig(
        router="least-outstanding",
        models={"llama-2-7b": {"weights_gib": 1.0}},  # a quick cold start
        autoscaler={
            "min": 1,
            "max": 4,
            "tick_s": 0.5,
            "scale_up_util": 0.7,
            "scale_down_util": 0.1,
        },
    )
    res = simulate_cluster(_SCALE, cc)
    reps = res.summary["replicas"]
    assert len(reps) > 1
    assert res.summary["model_loads"]  # the added replicas paid cold starts
    assert res.summary["gpu_seconds"] == pytest.approx(sum(r["gpu_seconds"] for r in reps))
    assert any(r["status"] == "left" for r in reps[1:])
    assert res.summary["finished"] == res.summary["requests"]


@settings(
    max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    tick=st.floats(0.05, 1.0),
    up=st.floats(0.3, 1.0),
    fail_at=st.one_of(st.none(), st.floats(0.0, 3.0)),
    router=st.sampled_from(["round-robin", "least-outstanding", "slo-aware"]),
)
def test_scaling_never_drops_or_duplicates(
    tick: float, up: float, fail_at: float | None, router: str
) -> None:
    cc = ClusterConfig(
        replicas=[{"count": 2}],
        router=router,
        models={"llama-2-7b": {"weights_gib": 0.5}},
        autoscaler={
            "min": 1,
            "max": 5,
            "tick_s": tick,
            "scale_up_util": up,
            "scale_down_util": up / 4,
        },
        failures=[]
        if fail_at is None
        else [{"replica": 1, "at_s": fail_at, "recover_s": fail_at + 1}],
        trace_decisions=True,
    )
    res = simulate_cluster(_SCALE, cc, check_invariants=True)
    assert len({r.req_id for r in res.requests}) == len(res.requests) == len(res.table)
    assert all(r.status.is_terminal for r in res.requests)
    s = res.summary
    assert s["requests"] == s["finished"] + s["aborted"] + s["rejected"]
    again = simulate_cluster(_SCALE, cc, check_invariants=True)  # deterministic
    pd.testing.assert_frame_equal(again.table, res.table)
    pd.testing.assert_frame_equal(again.decisions, res.decisions)
