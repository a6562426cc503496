"""Aladdin's analytic worker count (Eq. 7) and the reproduction harness on a tiny plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import assert_user_error, run_main
from sloserve.cluster.aladdin.gpu_count import fit_worker_law
from sloserve.core.errors import ConfigError
from sloserve.costmodel.profile import load_profile
from sloserve.experiments.aladdin.plan import ARMS, SPLIT_ARMS, Plan, Scenario
from sloserve.experiments.aladdin.reproduce import (
    prefill_workers,
    reproduce,
)
from sloserve.experiments.aladdin.whatif import (
    break_even_extra_s,
    lone_decode_s,
    slow_allreduce_profile,
)


def test_worker_law_recovers_a_line_and_guards_its_range() -> None:
    law = fit_worker_law([5, 10, 20], [3, 5, 9])  # exactly 0.4·r + 1
    assert (law.k5, law.c5, law.max_miss) == (pytest.approx(0.4), pytest.approx(1.0), 0)
    assert law.predict(12.5) == 6
    with pytest.raises(ConfigError, match="below R"):
        law.predict(1)
    with pytest.raises(ConfigError, match="two or more rates"):
        fit_worker_law([5, 5], [1, 2])


def test_tiny_reproduction_writes_data_and_headline(tmp_path: Path) -> None:
    plan = Plan(
        (Scenario("7b", "llama-2-7b", "a100-80gb", 1, 400, 15),),
        (2.0, 6.0),
        8.0,
        arms=(ARMS[0], ARMS[3]),
        max_workers=4,
    )
    rep = reproduce(plan, tmp_path)
    assert set(rep.gpus["arm"]) == {"aladdin", "vllm-default"}
    assert (rep.gpus["attainment"] >= 0.99).all()
    vd = rep.gpus[rep.gpus["arm"] == "vllm-default"]
    assert (vd["gpus"] % 4 == 0).all()  # a whole machine per worker
    head = json.loads((tmp_path / "headline.json").read_text())
    assert "vs vllm-default" in head["ours"]["7b"] and head["paper"]["vs vllm-default"] == -0.71
    law = head["worker_law"]["7b"]
    assert law["max_miss_workers"] == 0  # two rates: the line passes through both
    assert (tmp_path / "gpus_vs_rate.png").stat().st_size > 0


def test_split_phase_arms_count_decode_gpus(tmp_path: Path) -> None:
    sc = Scenario("7b", "llama-2-7b", "a100-80gb", 1, 400, 15)
    plan = Plan(
        (sc,),
        (2.0, 6.0),
        6.0,
        arms=(ARMS[0], *SPLIT_ARMS[:2]),
        max_workers=3,
        split_rates=(6.0,),
    )
    assert plan.rates_for(SPLIT_ARMS[0]) == (6.0,) and plan.rates_for(ARMS[0]) == (2.0, 6.0)
    assert prefill_workers(sc, 6.0) == 1 and prefill_workers(sc, 200.0) > 1
    rep = reproduce(plan, tmp_path)
    split = rep.gpus[rep.gpus["arm"].str.endswith("-split")]
    assert list(split["rate"]) == [6.0, 6.0] and (split["attainment"] >= 0.99).all()
    assert set(rep.headline["ours"]["7b"]) == {"split vs jsq-split"}


def test_split_kv_moves_over_pcie_on_the_pcie_testbed() -> None:
    """The A100 testbed has no NVLink (§6.1): its KV hand-offs take the PCIe rate, not the
    A100 family's measured NVLink 224 GB/s (the cluster's default link for the card)."""
    from sloserve.costmodel.catalog import gpu_spec
    from sloserve.costmodel.transfer import default_kv_link_gb_per_s

    pcie = Scenario("70b", "llama-2-70b", "a100-80gb-pcie", 2, 1600, 75)
    assert default_kv_link_gb_per_s(gpu_spec(pcie.gpu)) == 25.0
    assert default_kv_link_gb_per_s(gpu_spec("a100-80gb")) == 224.0


@pytest.mark.parametrize(
    ("rates", "needle"), [("x", "rates: 'x'"), ("0", "rates: '0'"), (",", "rates: ','")]
)
def test_reproduce_rates_bad_input_is_one_line(
    rates: str,
    needle: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("reproduce", "aladdin", "--quick", "--rates", rates, "--out", str(tmp_path))
    assert_user_error(run_main(monkeypatch, capsys, *args), needle)


def test_testbed_overhead_planner_gap_and_claims(tmp_path: Path) -> None:
    sc = Scenario("7b", "llama-2-7b", "a100-80gb", 1, 400, 15)
    plan = Plan(
        (sc,),
        (2.0, 6.0),
        8.0,
        arms=(ARMS[0], ARMS[3]),
        max_workers=4,
        testbed=(sc,),
        testbed_fractions=(0.3, 1.0),
        planner_gap=True,
        whatif_extra_us=(None,),
    )
    rep = reproduce(plan, tmp_path)
    # Figs. 9/10: one 4-GPU machine for every arm; the rates are the fractions of Eq. 6's.
    tb = rep.testbed
    assert tb is not None and set(tb["gpus"]) == {4}
    assert set(zip(tb["arm"], tb["workers"], strict=True)) == {
        ("aladdin", 4),
        ("jsq-optimal", 4),
        ("vllm-default", 1),
    }
    light, heavy = (tb[tb["load"] == f].set_index("arm") for f in (0.3, 1.0))
    assert (light["attainment"] >= heavy["attainment"]).all()
    assert (light["p99_atgt_ms"] <= heavy["p99_atgt_ms"]).all()
    assert (tmp_path / "testbed.csv").is_file() and (tmp_path / "testbed.png").is_file()
    # Fig. 13: Aladdin's rows carry its scheduling overhead, the JSQ rows none.
    g = rep.gpus.set_index("arm")
    assert (g.loc["aladdin", "sched_ms_per_decision"] > 0).all()
    assert g.loc["vllm-default", "sched_ms_per_decision"].isna().all()
    # Item 9: Eq. 7's GPUs beside the planner's, with the gap their difference.
    gap = rep.planner_gap
    assert gap is not None and list(gap["rate"]) == [2.0, 6.0]
    for r in ("aladdin", "least-loaded"):
        assert (gap["analytic_gpus"] - gap[f"planner_gpus_{r}"] == gap[f"gap_{r}"]).all()
    # The machine-readable headline `reproduce all` reads.
    head = json.loads((tmp_path / "headline.json").read_text())
    claim = next(c for c in head["claims"] if c["claim"] == "GPUs, Aladdin vs vllm-default")
    assert claim["paper"] == -0.71 and claim["scenario"] == "7b"
    assert claim["same_sign"] == (claim["ours"] < 0)
    assert claim["at_least_half"] == (claim["ours"] <= -0.355)
    assert len(head["planner_gap"]) == 2
    # The what-if: vLLM's default re-priced at the break-even all-reduce latency.
    wi = rep.whatif
    assert wi is not None and list(wi["rate"]) == [2.0, 6.0]
    assert wi["lone_ms"].iloc[0] == pytest.approx(lone_decode_s(sc.profile(1)) * 1e3, rel=1e-3)
    assert (wi["gpus"] % 4 == 0).all() and len(head["whatif_allreduce"]) == 2


def test_whatif_profile_reprices_only_the_all_reduce(tmp_path: Path) -> None:
    sc = Scenario("70b", "llama-2-70b", "a100-80gb-pcie", 2, 1600, 75)
    same = load_profile(str(slow_allreduce_profile(sc, 0.0, tmp_path)))
    assert same.coefficients == load_profile(sc.profile(4)).coefficients
    x = break_even_extra_s(sc)
    assert 100e-6 < x < 200e-6  # the 70B: a lone TP4 decode is ~22 ms faster over 161
    slow = str(slow_allreduce_profile(sc, x, tmp_path))
    assert lone_decode_s(slow) == pytest.approx(lone_decode_s(sc.profile(2)), rel=2e-3)
    assert break_even_extra_s(Scenario("x", "llama-2-7b", "a100-80gb", 4, 400, 15)) == 0.0


def test_fewest_finds_small_counts_when_more_workers_do_worse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    # (the package exports the function ``reproduce``, which shadows the module's name)
    rp = importlib.import_module("sloserve.experiments.aladdin.reproduce")

    # Best fit leaves extra workers idle: 6 to 10 workers pass, larger clusters miss.
    tried: list[int] = []

    def fake(plan: Plan, sc: Scenario, arm: object, rate: float, w: int, profile: object):  # type: ignore[no-untyped-def]
        tried.append(w)
        return rp.RunStats(0.995 if 6 <= w <= 10 else 0.9, 10.0)

    monkeypatch.setattr(rp, "run_stats", fake)
    plan = Plan((), (1.0,), 1.0, max_workers=32)
    sc = Scenario("x", "llama-2-7b", "a100-80gb", 1, 400, 15)
    w, st = rp.fewest(plan, sc, ARMS[0], 1.0)
    assert (w, st.attainment) == (6, 0.995) and tried[:4] == [1, 2, 4, 8]
    monkeypatch.setattr(rp, "run_stats", lambda *a: rp.RunStats(0.5, 10.0))
    assert rp.fewest(plan, sc, ARMS[0], 1.0)[0] == 33  # none passes: max_workers + 1
