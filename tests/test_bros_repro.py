"""`sloserve reproduce bros`: the quick plan's pieces on a tiny grid, the CLI, bad input."""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from sloserve import cli
from sloserve.cli import app
from sloserve.experiments.bros import (
    PAPER,
    Plan,
    Run,
    RunFailed,
    Scenario,
    execute,
    execute_keep_going,
    headline,
    measure_overhead,
    plan_runs,
    reproduce,
    rt_capacity,
)

SMALL = Scenario("llama-2-7b-a100", "sharegpt")


def test_tiny_grid_writes_every_experiment_and_the_headline(tmp_path: Path) -> None:
    plan = Plan(
        scenarios=(SMALL,),
        loads=(0.3,),
        duration_s=12.0,
        be_batch_size=32,
        micro_loads=(0.5,),
        ablation_load=0.3,
        ablation_scenarios=(SMALL,),
        overhead_queued=(100,),
        overhead_iterations=10,
        be_batch_seconds=(1.0, 3.0),
        be_batch_policies=("bros", "vllm"),
    )
    seen: list[tuple[int, int]] = []
    reproduce(plan, tmp_path / "b", workers=1, progress=lambda d, n: seen.append((d, n)))
    total = 4 + 3 + 2 + 4 + 2  # hybrid, micro, ablation, be_batch runs; overhead bros, vllm
    assert seen[-1] == (total, total) and len(seen) == total
    res = pd.read_parquet(tmp_path / "b" / "results.parquet")
    assert len(res) == 13
    assert set(res[res["experiment"] == "hybrid"]["policy"]) == {"bros", "vllm", "rr", "sarathi"}
    assert set(res[res["experiment"] == "ablation"]["policy"]) == {"bros", "bros-nobicache"}
    micro = res[res["experiment"] == "micro"]
    assert (micro["be_requests"] == 0).all() and micro["be_throughput_rps"].isna().all()
    hybrid = res[res["experiment"] == "hybrid"]
    assert (hybrid["be_requests"] > 0).all() and (hybrid["rt_requests"] > 0).all()
    bb = res[res["experiment"] == "be_batch"]
    sizes = sorted(set(bb["be_batch_size"]))
    assert len(bb) == 4 and len(sizes) == 2 and sizes[1] > 2 * sizes[0]  # 1 s and 3 s of BE work
    for name in ("hybrid", "micro", "ablation", "be_batch", "overhead"):
        assert (tmp_path / "b" / f"{name}.png").stat().st_size > 0
    head = json.loads((tmp_path / "b" / "headline.json").read_text())
    assert head["paper"] == PAPER
    assert {r["be_batch_size"] for r in head["be_batch_sensitivity"]} == set(sizes)
    for key in (
        "sharegpt.norm_latency_reduction_vs_vllm",
        "sharegpt.be_throughput_loss_vs_rr",
        "micro.throughput_ratio_vs_vllm",
        "ablation.tpot_attainment_ratio",
        "overhead.fraction_max",
    ):
        assert key in head["ours"], key
    ov = pd.read_parquet(tmp_path / "b" / "overhead.parquet")
    assert set(ov["policy"]) == {"bros", "vllm"} and (ov["iterations"] == 10).all()
    assert ((ov["overhead_fraction"] > 0) & (ov["overhead_fraction"] < 1)).all()


def test_bros_meets_more_rt_ttft_slos_than_vllm_and_rr_at_a_stated_be_cost() -> None:
    """The issue's check, on 30 s of ShareGPT RT at 30% of capacity with 256-request BE
    batches on Llama-2-7B/A100, where vLLM misses most TTFT SLOs. Measured (seed 0): TTFT
    attainment bros 0.99, rr 0.94, vllm 0.14; BE throughput bros 8.6 req/s = 0.78 of
    vLLM's 11.1 (the paper: 0.89); normalized latency bros 0.093 s/token, vllm 0.149."""
    cap = rt_capacity(SMALL)
    rows = {
        p: execute(Run("hybrid", SMALL, p, 0.3, cap * 0.3, 30.0, 256, 0, 256, 16))
        for p in ("bros", "vllm", "rr")
    }
    ttft = {p: r["rt_ttft_attainment"] for p, r in rows.items()}
    assert ttft["vllm"] < 0.5
    assert ttft["bros"] >= ttft["vllm"] + 0.5
    assert ttft["bros"] >= ttft["rr"] + 0.03
    assert rows["bros"]["be_throughput_rps"] >= 0.7 * rows["vllm"]["be_throughput_rps"]
    assert rows["bros"]["rt_norm_latency_s"] < 0.8 * rows["vllm"]["rt_norm_latency_s"]


def test_runs_are_deterministic_for_a_seed() -> None:
    run = Run("hybrid", SMALL, "bros", 0.3, 2.0, 8.0, 16, 3, 256, 16)
    a, b = execute(run), execute(run)
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b
    other = execute(replace(run, seed=4))
    other.pop("wall_s")
    assert other != a


def test_overhead_benchmark_times_one_schedule_per_iteration() -> None:
    row = measure_overhead("vllm", queued=100, iterations=15)
    assert row["iterations"] == 15 and row["queued"] == 100
    assert row["schedule_ms_mean"] > 0 and row["iteration_ms_mean"] > 0
    assert 0 < row["overhead_fraction"] < 1 and 0 < row["schedule_to_iteration"] < 1


def test_full_plan_covers_the_papers_grid() -> None:
    plan = Plan.full()
    assert len({s.profile for s in plan.scenarios}) >= 2
    assert {s.mix for s in plan.scenarios} == {"sharegpt", "lmsys"}
    assert plan.duration_s == 600.0 and len(plan.loads) >= 3
    assert plan.overhead_queued == (100, 1000)
    scen = (*plan.scenarios, *plan.ablation_scenarios)
    runs = plan_runs(plan, {s: 2.0 for s in scen}, {s.profile: 3.0 for s in scen})
    hybrid = [r for r in runs if r.experiment == "hybrid"]
    assert {r.policy for r in hybrid} == {"bros", "vllm", "rr", "sarathi"}
    assert all(r.be_batch_size == round(plan.be_batch_s * 3.0) for r in hybrid)
    assert {r.policy for r in runs if r.experiment == "ablation"} == {"bros", "bros-nobicache"}
    assert all(r.be_batch_size is None for r in runs if r.experiment == "micro")
    assert {r.rate for r in hybrid} == {2.0 * x for x in plan.loads}
    sizes = {r.be_batch_size for r in runs if r.experiment == "be_batch"}
    assert sizes == {round(x * 3.0) for x in plan.be_batch_seconds}
    assert plan.be_batch_s in plan.be_batch_seconds
    only = plan.with_policies(["vllm"])
    assert only.policies() == ["vllm"] and only.ablation_policies == ()


def _row(
    policy: str, load: float, lat: float, ttft: float, tpot: float, be: float
) -> dict[str, object]:
    return {
        "experiment": "hybrid",
        "profile": "p",
        "mix": "sharegpt",
        "policy": policy,
        "load": load,
        "rt_norm_latency_s": lat,
        "rt_ttft_attainment": ttft,
        "rt_tpot_attainment": tpot,
        "be_throughput_rps": be,
        "rt_throughput_rps": 1.0,
    }


def test_headline_averages_reductions_over_rates_and_ratios_of_mean_attainments() -> None:
    df = pd.DataFrame(
        [
            _row("bros", 0.1, 0.5, 0.9, 0.8, 9.0),
            _row("vllm", 0.1, 1.0, 0.1, 0.8, 10.0),
            _row("bros", 0.2, 1.0, 0.5, 0.6, 8.0),
            _row("vllm", 0.2, 4.0, 0.0, 0.4, 10.0),
        ]
    )
    ours = headline(df)["ours"]
    assert ours["sharegpt.norm_latency_reduction_vs_vllm"] == pytest.approx((0.5 + 0.75) / 2)
    assert ours["sharegpt.be_throughput_loss_vs_vllm"] == pytest.approx((0.1 + 0.2) / 2)
    assert ours["sharegpt.ttft_attainment_ratio_vs_vllm"] == pytest.approx(0.7 / 0.05)
    assert ours["sharegpt.tpot_attainment_ratio_vs_vllm"] == pytest.approx(0.7 / 0.6)
    assert ours["all.vllm_ttft_attainment"] == pytest.approx(0.05)
    # the per-rate maximum is infinite where vLLM meets no TTFT at all
    assert math.isinf(headline(df)["scenarios"]["p/sharegpt"]["ttft_attainment_ratio_vs_vllm_max"])


def test_cli_quick_on_a_tiny_grid(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    res = CliRunner().invoke(
        app,
        [
            "reproduce", "bros", "--quick", "--out", str(out), "--workers", "1",
            "--profiles", "llama-2-7b-a100", "--loads", "0.3", "--duration", "8",
            "--be-batch-size", "16", "--policies", "bros,vllm,bros-nobicache",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "headline" in res.stdout and "paper" in res.stdout and "Why ours differ" in res.stdout
    results = pd.read_parquet(out / "results.parquet")
    assert set(results["policy"]) == {"bros", "vllm", "bros-nobicache"}
    assert set(results["mix"]) == {"sharegpt", "lmsys"}
    assert set(results[results["experiment"] == "ablation"]["profile"]) == {"llama-2-7b-a100"}
    assert (out / "headline.json").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--policies", "bros,fifo-magic"], "fifo-magic"),
        (["--policies", " , "], "--policies"),
        (["--loads", "0.2,fast"], "--loads"),
        (["--loads", "0,0.3"], "--loads"),
        (["--profiles", "llama-2-7b@nowhere"], "nowhere"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    args: list[str],
    needle: str,
) -> None:
    argv = ["sloserve", "reproduce", "bros", "--quick", "--out", str(tmp_path / "x"), *args]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as ei:
        cli.main()
    _, err = capsys.readouterr()
    assert ei.value.code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sloserve: error: "), err
    assert needle in lines[0]
    assert "Traceback" not in err


def test_a_failing_run_names_itself_or_becomes_a_row_with_keep_going() -> None:
    bad = Run(
        "hybrid", Scenario("no-such-profile", "sharegpt"), "vllm", 0.3, 1.0, 5.0, 8, 0, 256, 16
    )
    with pytest.raises(
        RunFailed, match=re.escape("hybrid no-such-profile/sharegpt vllm at load 0.3")
    ):
        execute(bad)
    row = execute_keep_going(bad)
    assert "no-such-profile" in row["error"] and row["policy"] == "vllm"
