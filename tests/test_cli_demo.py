"""``sloserve demo``: the built-in demo report, its flags and ``--config`` overriding and
merging into the built-in configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from cli_app_helpers import (
    REPORT_FILES,
    invoke,
)
from cli_helpers import write
from sloserve.config import builtin_config


# ----------------------------------------------------------------------------- demo
def test_demo_writes_report(tmp_path: Path, wide: None) -> None:
    out_dir = tmp_path / "demo"
    res = invoke("demo", "--duration", "20", "--out", out_dir)
    assert "report written to" in res.stdout
    for f in REPORT_FILES:
        assert (out_dir / f).stat().st_size > 0, f
    summary = json.loads((out_dir / "summary.json").read_text())
    builtin = builtin_config("demo")
    expected = builtin["policies"]
    assert list(summary) == expected
    for name in expected:
        assert name in res.stdout
    config = json.loads((out_dir / "config.json").read_text())["config"]
    assert config["workload"]["arrival"] == {
        **builtin["workload"]["arrival"],
        "rate": float(builtin["workload"]["arrival"]["rate"]),
    }
    assert config["workload"]["duration_s"] == 20.0
    df = pd.read_parquet(out_dir / "requests.parquet")
    assert len(df) == len(expected) * summary["vllm"]["requests"]


def test_demo_flags_override_builtin(tmp_path: Path, wide: None) -> None:
    out_dir = tmp_path / "demo"
    invoke(
        "demo", "--duration", "10", "--rate", "3", "--seed", "2",
        "--policies", "vllm,sarathi", "--out", out_dir,
    )  # fmt: skip
    config = json.loads((out_dir / "config.json").read_text())
    assert config["policies"] == ["vllm", "sarathi"]
    arrival = config["config"]["workload"]["arrival"]
    assert arrival["kind"] == "bursty" and arrival["rate"] == 3.0
    assert config["config"]["workload"]["seed"] == 2


def test_demo_config_policies_and_instance(tmp_path: Path, wide: None) -> None:
    cfg = write(
        tmp_path / "demo.yaml",
        "policies: [vllm, edf]\ninstance: {max_running: 16, cost_model: 'constant:0.01'}\n",
    )
    out_dir = tmp_path / "demo"
    invoke("demo", "--config", cfg, "--duration", "10", "--out", out_dir)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert list(summary) == ["vllm", "edf"]
    assert summary["edf"]["limits"]["max_running"] == 16


def test_demo_config_merges_into_builtin(tmp_path: Path, wide: None) -> None:
    cfg = write(tmp_path / "short.yaml", "workload:\n  duration_s: 10\n")
    out_dir = tmp_path / "demo"
    invoke("demo", "--config", cfg, "--policies", "vllm", "--out", out_dir)
    workload = json.loads((out_dir / "config.json").read_text())["config"]["workload"]
    assert workload["duration_s"] == 10.0
    assert workload["arrival"]["kind"] == "bursty"
