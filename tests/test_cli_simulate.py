"""``sloserve simulate`` in process: the JSON summary and its determinism, workload and
instance flags reaching the config, the horizon, arrival kinds, the table output,
the ``--out`` report and replaying a trace file."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cli_app_helpers import (
    FAST,
    REPORT_FILES,
    SHORT,
    SUMMARY_KEYS,
    drop_wall,
    invoke,
    invoke_json,
)
from cli_helpers import write
from sloserve.workloads import WorkloadSpec, build_requests


# ----------------------------------------------------------------------------- simulate
def test_simulate_json_summary() -> None:
    args = ["simulate", "--policy", "vllm", "--workload", "sharegpt", "--rate", "4"]
    s = invoke_json(*args, "--duration", "30")
    assert set(s) >= SUMMARY_KEYS
    assert s["policy"] == "vllm"
    assert s["requests"] > 60
    assert s["finished"] == s["requests"]
    assert s["rejected"] == 0 and s["aborted"] == 0
    assert 0 < s["ttft_p50"] <= s["ttft_p99"]
    assert 0 < s["tpot_p50"] <= s["tpot_p99"]
    assert 0 < s["e2e_p50"] <= s["e2e_p99"]
    assert 0 <= s["slo_attainment"] <= 1
    assert 0 <= s["qoe_mean"] <= 1
    assert s["simulated_seconds"] >= 25
    assert s["throughput_requests_per_s"] == pytest.approx(s["finished"] / s["simulated_seconds"])
    assert isinstance(s["preemptions"], int)
    assert s["profile"] == "llama-2-7b-a100"
    assert s["seed"] == 0


def test_simulate_json_is_deterministic() -> None:
    args = ["simulate", "--policy", "vllm", "--workload", "sharegpt", "--rate", "4"]
    a = invoke_json(*args, "--duration", "30")
    b = invoke_json(*args, "--duration", "30")
    assert drop_wall(a) == drop_wall(b)
    assert a["wall_seconds"] >= 0


def test_simulate_request_count_matches_workload() -> None:
    s = invoke_json("simulate", *SHORT, *FAST, "--seed", "3")
    expected = build_requests(
        WorkloadSpec.model_validate(
            {"arrival": {"kind": "poisson", "rate": 2.0}, "duration_s": 30.0, "seed": 3}
        )
    )
    assert s["requests"] == len(expected)


def test_simulate_flags_reach_the_config() -> None:
    s = invoke_json(
        "simulate",
        *SHORT,
        *FAST,
        "--policy",
        "sarathi",
        "--max-running",
        "7",
        "--max-batch-tokens",
        "2048",
        "--chunk-size",
        "256",
        "--block-size",
        "8",
        "--kv-capacity",
        "50000",
        "--predictor",
        "constant:100",
        "--seed",
        "4",
    )
    assert s["policy"] == "sarathi"
    assert s["limits"] == {
        "max_batch_tokens": 2048,
        "max_prefill_tokens": 256,
        "kv_capacity_tokens": 50000,
        "max_running": 7,
        "block_size": 8,
    }
    assert s["predictor"] == "constant:100"
    assert s["seed"] == 4


def test_simulate_kv_utilization_changes_capacity() -> None:
    lo = invoke_json("simulate", *SHORT, *FAST, "--kv-utilization", "0.5")
    hi = invoke_json("simulate", *SHORT, *FAST, "--kv-utilization", "0.9")
    assert 0 < lo["kv_capacity_tokens"] < hi["kv_capacity_tokens"]


def test_simulate_horizon_aborts() -> None:
    s = invoke_json("simulate", "--rate", "20", "--duration", "30", "--horizon", "5")
    assert s["aborted"] > 0
    assert s["finished"] > 0
    assert s["simulated_seconds"] <= 5 + 1e-9


def test_simulate_horizon_accounts_for_every_request() -> None:
    """Requests arriving after the horizon never reach the replica and are left out."""
    s = invoke_json("simulate", "--rate", "20", "--duration", "30", "--horizon", "5")
    assert s["finished"] + s["aborted"] + s["rejected"] == s["requests"]


def test_simulate_num_requests_caps() -> None:
    s = invoke_json("simulate", *SHORT, *FAST, "--num-requests", "9")
    assert s["requests"] == 9


@pytest.mark.parametrize("arrival", ["poisson", "gamma", "constant", "bursty"])
def test_simulate_arrival_kinds(arrival: str) -> None:
    extra = ["--burst-period", "10"] if arrival == "bursty" else []
    s = invoke_json("simulate", "--arrival", arrival, *SHORT, *FAST, *extra)
    assert s["finished"] == s["requests"] > 0
    if arrival == "constant":
        assert s["requests"] == 60


def test_simulate_table_output(wide: None) -> None:
    out = invoke("simulate", "--policy", "sarathi-nocp-ef", *SHORT, *FAST).stdout
    assert "sarathi-nocp-ef" in out
    assert "requests" in out and "simulated" in out
    for header in ("TTFT p50 s", "TPOT p99 ms", "SLO att.", "QoE"):
        assert header in out


def test_simulate_out_writes_report(tmp_path: Path, wide: None) -> None:
    out_dir = tmp_path / "nested" / "run"
    res = invoke("simulate", *SHORT, *FAST, "--out", out_dir)
    assert "report written to" in res.stdout
    for f in REPORT_FILES:
        assert (out_dir / f).stat().st_size > 0, f
    summary = json.loads((out_dir / "summary.json").read_text())
    assert list(summary) == ["vllm"]


def test_simulate_trace_replay(tmp_path: Path) -> None:
    trace = write(
        tmp_path / "t.csv",
        "arrival_s,prompt_tokens,output_tokens,class\n"
        "0,100,10,rt\n0.5,2000,20,be\n1.0,50,5,rt\n3.0,10,1,rt\n",
    )
    out_dir = tmp_path / "r"
    s = invoke_json("simulate", "--trace", trace, *FAST, "--out", out_dir)
    assert s["requests"] == s["finished"] == 4
    df = pd.read_parquet(out_dir / "requests.parquet").sort_values("req_id")
    assert df["arrival_s"].tolist() == [0.0, 0.5, 1.0, 3.0]
    assert df["prompt_tokens"].tolist() == [100, 2000, 50, 10]
    assert df["output_tokens"].tolist() == [10, 20, 5, 1]
    assert df["generated_tokens"].tolist() == [10, 20, 5, 1]
    assert df["class"].tolist() == ["rt", "be", "rt", "rt"]
