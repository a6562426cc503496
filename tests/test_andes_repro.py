"""`sloserve reproduce andes --quick`: the evaluation harness end to end (about 15 s)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sloserve.cli import app
from sloserve.experiments.andes.plan import Plan, Scenario, plan_runs
from sloserve.experiments.andes.reproduce import _max_sustained


def _burstgpt(path: Path, n: int = 300) -> Path:
    """A small BurstGPT-format log: 300 requests over 90 s, a few failures."""
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 90, n))
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for i, ts in enumerate(t):
        p, o = int(rng.integers(50, 1500)), (0 if i % 50 == 0 else int(rng.integers(20, 400)))
        lines.append(f"{ts:.3f},ChatGPT,{p},{o},{p + o},Conversation log")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_quick_reproduction_writes_results_plots_and_headline(tmp_path: Path) -> None:
    out = tmp_path / "andes"
    bg = _burstgpt(tmp_path / "burstgpt.csv")
    res = CliRunner().invoke(
        app,
        [
            "reproduce",
            "andes",
            "--quick",
            "--out",
            str(out),
            "--workers",
            "2",
            "--burstgpt",
            str(bg),
        ],
    )
    assert res.exit_code == 0, res.output
    results = pd.read_parquet(out / "results.parquet")
    for exp in ("intensity", "duration", "poisson", "refiner", "solver", "burstgpt"):
        assert (out / f"{exp}.png").stat().st_size > 0
        assert (results["experiment"] == exp).any()
    head = json.loads((out / "headline.json").read_text())
    assert head["paper"]["qoe_ratio_vs_vllm_intensity"] == 4.7
    sc = head["scenarios"]["llama-2-7b-a100/andes-sharegpt"]
    # Andes beats vLLM under the default burst, and the refiner cuts preemptions
    e = results[(results["experiment"] == "intensity") & (results["x"] == 2.0)].set_index("policy")
    assert e.loc["andes", "qoe_mean"] > e.loc["vllm", "qoe_mean"]
    assert (
        sc["preemptions_per_request"]["refiner on"] < sc["preemptions_per_request"]["refiner off"]
    )
    assert "headline" in res.stdout and "paper" in res.stdout
    bg_rows = results[results["experiment"] == "burstgpt"]
    assert set(bg_rows["policy"]) == {"vllm", "sarathi", "lqsf", "andes"}
    assert (bg_rows["requests"] == 294).all()  # 6 failed requests dropped


def test_plan_covers_every_policy_and_knob() -> None:
    plan = Plan.full()
    assert Scenario("llama-2-7b-a100", "lmsys") in plan.scenarios
    assert (
        len({s.profile for s in plan.scenarios}) >= 2 and len({s.mix for s in plan.scenarios}) >= 2
    )
    runs = plan_runs(plan, {s: 3.0 for s in plan.scenarios})
    assert {r.policy for r in runs} == {"vllm", "sarathi", "lqsf", "andes"}
    bursts = [r for r in runs if r.arrival["kind"] == "bursty"]
    assert all(r.arrival["intensity"] * r.arrival["burst_fraction"] < 1 for r in bursts)
    assert all(r.arrival["rate"] == 3.0 for r in bursts)  # mean rate = measured capacity


def test_max_sustained_interpolates_the_qoe_line() -> None:
    df = pd.DataFrame({"x": [1.0, 2.0, 3.0], "qoe_mean": [0.99, 0.97, 0.91]})
    assert _max_sustained(df) == pytest.approx(2.0 + (0.97 - 0.95) / (0.97 - 0.91))
    assert _max_sustained(df.assign(qoe_mean=[0.9, 0.8, 0.7])) != _max_sustained(df)


def test_paper_scale_plan_runs_table2_lengths_unclipped_on_the_papers_models() -> None:
    """Andes §6.1: Llama-3.1-70B and Phi-3.5-MoE on 8× A100-40GB, Multi-Round ShareGPT
    lengths (mean prompt 3,171, std 7,943) unclipped: C is raised to the models' context so
    that vLLM rejects nothing (with C = 4,096 it rejects every request over 4,096 tokens)."""
    from dataclasses import replace

    from sloserve.experiments.runner import simulate

    plan = Plan.paper()
    assert {s.profile for s in plan.scenarios} == {
        "llama-3.1-70b@a100-40gbx8",
        "phi-3.5-moe@a100-40gbx8",
    }
    runs = plan_runs(plan, {s: 2.0 for s in plan.scenarios})
    assert {r.experiment for r in runs} == {"intensity", "duration"}
    assert all(r.config().instance.max_batch_tokens == 131_072 for r in runs)
    assert all(r.config().instance.max_running == 1024 for r in runs)
    run = next(r for r in runs if r.policy == "vllm" and r.experiment == "intensity")
    short = replace(run, duration_s=20.0)
    s = simulate(short.config())
    prompts = s.table["prompt_tokens"]
    assert prompts.max() > 4096 and s.summary["rejected"] == 0
    clipped = replace(short, max_batch_tokens=4096)
    s4 = simulate(clipped.config()).summary
    assert s4["rejected"] == int((s.table["prompt_tokens"] + s.table["output_tokens"] > 4096).sum())
    assert s4["rejected"] > 0


def test_paper_scale_and_quick_are_exclusive(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli_helpers import assert_user_error, run_main

    proc = run_main(monkeypatch, capsys, "reproduce", "andes", "--quick", "--paper-scale")
    assert_user_error(proc, "--quick", "--paper-scale")
    proc = run_main(monkeypatch, capsys, "reproduce", "andes", "--cycle", "1e300")
    assert_user_error(proc, "--cycle")
