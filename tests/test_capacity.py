"""The capacity planner: the hand-computed minimum on a constant cost model, the searches'
monotonicity checks, early stopping that never changes a verdict, and the export."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

import sloserve
from conftest import CONST_STEP_S
from sloserve.core.errors import ConfigError
from sloserve.experiments.capacity import planner
from sloserve.experiments.capacity.probe import Probe, ProbeResult, run_probe
from sloserve.experiments.capacity.search import FewestSearch, HighestRateSearch, run_searches
from sloserve.experiments.capacity.slo import parse_slo
from sloserve.experiments.capacity.space import Arm, Layout, groups, parse_layout, parse_rates
from sloserve.experiments.executor import LocalExecutor

STEP_S = CONST_STEP_S  # every iteration of the constant profile (conftest)
OUT_LEN = 10  # output tokens per request: one prefill step, then nine decode steps


def _base(rate: float, duration: float = 20.0) -> dict[str, Any]:
    # Deterministic arrivals, equal requests and one request per replica at a time: a
    # replica serves a request in OUT_LEN steps, so it keeps up iff its share of the
    # arrivals (rate / n under round-robin) leaves OUT_LEN * STEP_S between them.
    return {
        "workload": {
            "arrival": {"kind": "constant", "rate": rate},
            "duration_s": duration,
            "prompt": {"kind": "fixed", "value": 16},
            "output": {"kind": "fixed", "value": OUT_LEN},
        },
        "instance": {"max_running": 1},
    }


@pytest.mark.parametrize("rate", [8.0, 25.0, 45.0])
def test_the_minimum_is_the_hand_computed_one_and_one_fewer_fails(
    const_profile: str, rate: float
) -> None:
    hand = math.ceil(rate * OUT_LEN * STEP_S)  # replicas needed so that no queue grows
    res = sloserve.plan_capacity(
        _base(rate),
        slo="ttft=50ms",
        attainment=0.99,
        profiles=[const_profile],
        routers="round-robin",
        policies="vllm",
        rates=[rate],
        seeds=[0],
        workers=1,
    )
    row = res.answers.iloc[0]
    assert int(row["replicas"]) == hand
    assert row["attainment"] == 1.0
    assert not res.checks and bool(row["monotone"])
    if hand > 1:
        assert int(row["neighbour_replicas"]) == hand - 1
        assert row["neighbour_attainment"] < 0.99
        # the neighbour fails when run to its end too (not only as a stopped run)
        arm = Arm(const_profile, "round-robin", "vllm")
        full = run_probe(
            Probe(
                _base(rate), arm, hand - 1, rate, 0, parse_slo("ttft=50ms"), 0.99, early_stop=False
            )
        )
        assert not full.passes and full.stopped_at_s is None
        assert "queueing" in _explain_below(res)


def _explain_below(res: planner.CapacityResult) -> str:
    from sloserve.experiments.capacity.explain import describe

    return describe({str(k): v for k, v in res.answers.iloc[0].to_dict().items()}, "explain_below")


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_early_stopping_never_changes_the_verdict(const_profile: str, n: int) -> None:
    arm = Arm(const_profile, "round-robin", "vllm")
    targets = parse_slo("ttft_p90=50ms,tpot=20ms")
    runs = [
        run_probe(Probe(_base(30.0), arm, n, 30.0, 0, targets, 0.95, early_stop=stop))
        for stop in (True, False)
    ]
    stopped, full = runs
    assert stopped.passes == full.passes == (n >= 3)
    assert stopped.attainment >= full.attainment - 1e-12  # an upper bound when stopped
    if not full.passes:
        assert stopped.stopped_at_s is not None and stopped.wall_s < full.wall_s


def test_early_stopping_agrees_on_a_realistic_workload() -> None:
    base = {"workload": {"arrival": {"kind": "poisson", "rate": 6}, "duration_s": 30}}
    arm = Arm("llama-2-7b-a40", "least-loaded", "vllm")
    targets = parse_slo("ttft_p90=500ms,tpot_p90=50ms")
    for n in (1, 2):
        a, b = (
            run_probe(Probe(base, arm, n, 6.0, 1, targets, 0.9, early_stop=s))
            for s in (True, False)
        )
        assert a.passes == b.passes


# --------------------------------------------------------------- the searches, synthetic


def _threshold(item: tuple[int, float]) -> bool:
    need, x = item
    return x >= need


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("need", [1, 2, 7, 13, 40])
def test_the_fewest_search_brackets_and_bisects(need: int, k: int) -> None:
    s = FewestSearch("a", 1, 64, 1)
    with LocalExecutor(1) as ex:
        run_searches([s], lambda _s, x, _seed: (need, x), _threshold, bool, ex, k=k)
    assert s.answer == need and not s.violations()
    if need > 1:
        assert s.neighbour == need - 1 and s.visited[need - 1] is False
    assert len(s.visited) <= 2 * math.ceil(math.log2(64)) + 2


def test_no_count_up_to_the_maximum_passes() -> None:
    s = FewestSearch("a", 1, 8, 1)
    with LocalExecutor(1) as ex:
        run_searches([s], lambda _s, x, _seed: (100, x), _threshold, bool, ex)
    assert s.answer is None and s.done


def _bumpy(x: float) -> bool:
    # passes at 2, fails from 3 to 9, passes from 10: attainment not monotone in replicas
    return x == 2 or x >= 10


def test_a_non_monotone_case_is_reported_not_hidden() -> None:
    s = FewestSearch("a", 1, 64, 1)
    with LocalExecutor(1) as ex:
        run_searches([s], lambda _s, x, _seed: x, _bumpy, bool, ex, k=3)
    assert s.answer == 2
    assert s.violations(), s.visited  # 2 passed, but a larger count failed
    assert all(v.passing < v.failing for v in s.violations())


def _fake_probe(p: Probe) -> ProbeResult:
    ok = _bumpy(p.replicas)
    return ProbeResult(
        p.arm,
        p.replicas,
        p.rate,
        p.seed,
        ok,
        1.0 if ok else 0.5,
        None,
        10,
        p.rate,
        p.replicas,
        1.0,
        None,
        100,
        0.0,
    )


def test_the_planner_reports_a_violation_in_its_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    # three workers: a round probes 1, 2 and 4 together, and 4 fails above the passing 2
    monkeypatch.setattr(planner, "run_probe", _fake_probe)
    res = planner.fewest_gpus(
        {"workload": {"duration_s": 5}},
        [Arm("llama-2-7b-a100", "round-robin", "vllm")],
        [4.0],
        (),
        0.99,
        seeds=(0,),
        max_replicas=64,
        executor="local",
        workers=3,
    )
    assert int(res.answers["replicas"][0]) == 2
    assert res.checks and "not monotone in replicas (2 passed but 4 failed" in res.checks[0]
    assert not bool(res.answers["monotone"][0])


def _rate_ok(x: float) -> bool:
    return x <= 7.3


def test_the_rate_search_ends_within_its_tolerance() -> None:
    s = HighestRateSearch("a", 0.05, 1e4, 1.0, 0.05)
    with LocalExecutor(1) as ex:
        run_searches([s], lambda _s, x, _seed: x, _rate_ok, bool, ex, k=2)
    assert s.answer is not None and s.neighbour is not None
    assert s.answer <= 7.3 < s.neighbour <= s.answer * 1.05
    assert not s.violations()


def test_max_rate_of_a_fixed_cluster_on_the_constant_model(const_profile: str) -> None:
    # 3 replicas, each serving a request in 0.1 s: 30 req/s exactly, no more
    cfg = {
        **_base(10.0),
        "cluster": {"replicas": [{"count": 3, "profile": const_profile}], "router": "round-robin"},
    }
    cfg["instance"] = {"max_running": 1, "profile": const_profile}
    res = sloserve.plan_capacity(
        cfg, slo="ttft=50ms", attainment=0.99, max_rate=True, seeds=[0], workers=1, tolerance=0.05
    )
    row = res.answers.iloc[0]
    assert row["max_rate"] <= 30.0 + 1e-9 < row["failing_rate"] <= row["max_rate"] * 1.05
    assert row["gpus"] == 3 and bool(row["monotone"])


# --------------------------------------------------------------- space, parsing, export


def test_layouts_mixes_and_rates() -> None:
    assert parse_layout("pd:1:2").split(6) == (2, 4)
    assert Layout(1, 1).split(2) == (1, 1) and Layout(1, 3).split(2) == (1, 1)
    mix = Arm("llama-2-7b-a100+llama-2-7b-h100", "least-loaded", "vllm")
    assert [g["count"] for g in groups(mix, 5, {"llama-2-7b-a100": 2.0})] == [3, 2]
    assert groups(mix, 5, {"llama-2-7b-a100": 2.0})[0]["gpu_hour_usd"] == 2.0
    assert parse_rates("2:20:2") == tuple(float(x) for x in range(2, 21, 2))
    assert parse_rates("4,1,4") == (1.0, 4.0)
    for bad, msg in [("20:2", "max 2 < min 20"), ("1:5:0", "step"), ("a,b", "MIN:MAX")]:
        with pytest.raises(ConfigError, match=msg):
            parse_rates(bad)
    with pytest.raises(ConfigError, match="--layouts: 'pd:0:1'"):
        parse_layout("pd:0:1")
    with pytest.raises(ConfigError, match="not a duration"):
        parse_slo("ttft_p90=2x")
    with pytest.raises(ConfigError, match="percentile 0"):
        parse_slo("ttft_p0=2s")


def test_bad_inputs_are_one_line_config_errors() -> None:
    wl = {"arrival": {"kind": "poisson", "rate": 2}, "duration_s": 5}
    cases: list[tuple[dict[str, Any], str]] = [
        (dict(attainment=1.5), "--attainment: 1.5 is outside (0, 1]"),
        (dict(attainment=0.0), "--attainment: 0.0 is outside (0, 1]"),
        (dict(routers=[]), "--routers: the search space is empty"),
        (dict(rates="20:2"), "max 2 < min 20"),
        (
            dict(slo="tpot=1ms", profiles="llama-2-70b-a100x2"),
            "tpot=0.001s cannot be met on llama-2-70b-a100x2: even the easiest request alone takes",
        ),
        (dict(routers="nope"), "--routers: unknown router 'nope'"),
    ]
    for kwargs, msg in cases:
        with pytest.raises(ConfigError) as ei:
            sloserve.plan_capacity(wl, **{"slo": "ttft=2s", **kwargs})
        assert msg in str(ei.value) and "\n" not in str(ei.value)


def test_the_export_is_what_vllm_and_the_charts_take(tmp_path: Path) -> None:
    from sloserve.experiments.capacity.export import replica_kinds, serve_script, values_file

    base = {"workload": {"duration_s": 5}}
    cluster = {
        "replicas": [
            {"count": 2, "profile": "llama-2-70b-a100x2", "role": "prefill"},
            {"count": 3, "profile": "llama-2-70b-a100x2", "role": "decode"},
        ]
    }
    kinds = replica_kinds(base, cluster, "sarathi")
    script = serve_script(kinds, "plan")
    assert script.count("vllm serve meta-llama/Llama-2-70b-hf --tensor-parallel-size 2") == 2
    assert "--enable-chunked-prefill" in script and "NixlConnector" in script
    values = yaml.safe_load(values_file(kinds, "plan"))
    assert values["prefill"]["replicas"] == 2 and values["decode"]["replicas"] == 3
    assert values["decode"]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert values["modelArtifacts"]["name"] == "meta-llama/Llama-2-70b-hf"
    vllm = replica_kinds(base, {"replicas": [{"count": 1}]}, "vllm")[0]
    assert not vllm.chunked_prefill and "--no-enable-chunked-prefill" in vllm.command()


def test_the_output_folder(tmp_path: Path, const_profile: str) -> None:
    res = sloserve.plan_capacity(
        _base(25.0, 10.0),
        slo="ttft=50ms",
        attainment=0.99,
        profiles=[const_profile],
        routers="round-robin,least-loaded",
        policies="vllm",
        rates=[15.0, 25.0],
        seeds=[0, 1],
        workers=1,
        prices={const_profile: 2.5},
        out=tmp_path,
    )
    for f in (
        "answers.csv",
        "probes.csv",
        "capacity.json",
        "explain.md",
        "gpus_vs_rate.png",
        "pareto.png",
        "deploy/vllm-serve.sh",
        "deploy/values.yaml",
    ):
        assert (tmp_path / f).is_file(), f
    a = res.answers
    assert list(a["replicas"]) == [2, 2, 3, 3]
    assert (a["usd_per_hour"] == a["gpus"] * 2.5).all()
    assert a["cost_per_mtok"].notna().all() and (a["seeds"] == 2).all()
    # rounds are searched together: a rate's answer is the next rate's start
    assert res.rounds < res.simulations
    text = (tmp_path / "explain.md").read_text()
    assert "replicas (one below)" in text


def test_a_saturated_run_tells_how_far_to_jump(const_profile: str) -> None:
    # 2 replicas serve 20 req/s of the 45 offered: about 2.25× behind, 5 replicas keep up
    arm = Arm(const_profile, "round-robin", "vllm")
    r = run_probe(Probe(_base(45.0), arm, 2, 45.0, 0, parse_slo("ttft=50ms"), 0.99))
    assert r.stopped_at_s is not None and 1.8 < r.load_ratio < 2.6
    s = FewestSearch("a", 1, 64, 1)
    s.record(2, False, 2 * r.load_ratio)
    assert s.propose(1) == [math.ceil(2 * r.load_ratio)] == [5]
    assert s.propose(2) == [5, 7]  # the bound, then 30 % headroom (ceil(5 × 1.3))


def test_without_targets_the_workloads_own_class_slos_decide() -> None:
    from sloserve.experiments.capacity.slo import MissWatch, verdict

    cfg = {
        "workload": {"duration_s": 10, "classes": {"rt": 0.5, "be": 0.5}, "slo": "bros"},
        "cluster": {"replicas": [{"count": 1}]},
    }
    res = sloserve.simulate(cfg)
    rt = int((res.table["class"] == "rt").sum())
    assert 0 < rt < len(res.table)  # best-effort requests have no SLO under 'bros'
    v = verdict(res.table, (), 0.9)
    assert v.counted == rt and v.attainment == pytest.approx(res.summary["slo_attainment"])
    watch = MissWatch((), 0.9)
    watch(0.0, res.requests)
    assert watch.counted == rt


def test_local_ray_gives_the_same_answers(const_profile: str) -> None:
    ray = pytest.importorskip("ray")
    from sloserve.experiments.executor import RayExecutor

    def plan(executor: Any) -> Any:
        return sloserve.plan_capacity(
            _base(25.0, 10.0),
            slo="ttft=50ms",
            attainment=0.99,
            profiles=[const_profile],
            routers="round-robin",
            policies="vllm",
            rates=[15.0, 25.0],
            seeds=[0],
            executor=executor,
        )

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = plan(RayExecutor())
    finally:
        ray.shutdown()
    with LocalExecutor(2) as ex:
        local = plan(ex)
    assert on_ray.answers.equals(local.answers)
    assert list(on_ray.answers["replicas"]) == [2, 3]
    drop = ["wall_s"]
    assert on_ray.probes.drop(columns=drop).equals(local.probes.drop(columns=drop))


def test_disaggregated_and_mixed_arms_run(tmp_path: Path) -> None:
    res = sloserve.plan_capacity(
        {"arrival": {"kind": "poisson", "rate": 2}, "duration_s": 10, "mix": "sharegpt"},
        slo="ttft_p90=2s",
        attainment=0.9,
        routers="least-loaded",
        policies="sarathi",
        profiles="llama-2-7b-a100,llama-2-7b-a100+llama-2-7b-a40",
        layouts="agg,pd:1:1",
        rates=[2.0],
        seeds=[0],
        workers=1,
        out=tmp_path,
    )
    a = res.answers.set_index(["profile", "layout"])["replicas"]
    assert a[("llama-2-7b-a100", "pd1:1")] >= 2  # one prefill and one decode at least
    assert a[("llama-2-7b-a100", "agg")] >= 1
    probes = res.probes
    assert set(probes["layout"]) == {"agg", "pd1:1"}
    assert (probes[probes["layout"] == "pd1:1"]["replicas"] >= 2).all()


def test_a_profiles_own_price_is_used(const_profile: str, tmp_path: Path) -> None:
    data = yaml.safe_load(Path(const_profile).read_text())
    priced = tmp_path / "priced.yaml"
    priced.write_text(yaml.safe_dump({**data, "gpu_hour_usd": 3.0}))
    res = sloserve.plan_capacity(
        _base(25.0, 10.0),
        slo="ttft=50ms",
        profiles=[str(priced)],
        routers="round-robin",
        rates=[25.0],
        seeds=[0],
        workers=1,
    )
    assert res.answers["usd_per_hour"][0] == pytest.approx(3 * 3.0)
    # the rendered built-in profiles do not gain the field when it is unset
    from sloserve.costmodel.fit.writer import render_profile_yaml

    assert "gpu_hour_usd" not in render_profile_yaml(sloserve.load_profile("llama-2-7b-a100"))


def test_router_parameters_reach_the_router() -> None:
    res = sloserve.plan_capacity(
        {"arrival": {"kind": "poisson", "rate": 2}, "duration_s": 10, "mix": "sharegpt"},
        slo="ttft_p90=2s,tpot_p90=100ms",
        attainment=0.9,
        routers="aladdin",
        rates=[2.0],
        seeds=[0],
        workers=1,
        router_params={"aladdin": {"gamma": 1.0, "theta": 0.5}},
    )
    assert res.answers["replicas"].iloc[0] >= 1
    with pytest.raises(ConfigError, match=r"--router-params: router 'aladdin': .*'gama'"):
        sloserve.plan_capacity(
            {"duration_s": 5},
            slo="ttft=2s",
            routers="aladdin",
            rates=[2.0],
            router_params={"aladdin": {"gama": 1.0}},
        )
