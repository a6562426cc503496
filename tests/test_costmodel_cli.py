"""The cost-model commands end to end: show, fit, profile (tiny model on CPU)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sloserve.cli import app
from sloserve.costmodel.profile import load_profile

runner = CliRunner()


def test_costmodel_show_profile_and_specs() -> None:
    res = runner.invoke(app, ["costmodel", "show", "--profile", "llama-2-7b-a100", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["kv"]["capacity_tokens"] == load_profile("llama-2-7b-a100").kv_capacity_tokens(0.9)
    assert all(p["tokens_per_s"] > 1000 for p in d["prefill"])
    steps = d["decode"]["step_ms"]
    assert steps[-1][-1] > steps[0][0]  # bigger batches and contexts take longer
    res = runner.invoke(app, ["costmodel", "show", "--model", "llama-3-8b", "--gpu", "h100-80gb"])
    assert res.exit_code == 0 and "max batch" in res.stdout


def test_costmodel_show_needs_a_profile_or_specs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sloserve.cli", "costmodel", "show", "--model", "llama-2-7b"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--gpu" in proc.stderr


def test_profile_fit_simulate_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    csv, yaml_ = tmp_path / "m.csv", tmp_path / "m.yaml"
    res = runner.invoke(
        app,
        ["profile", "tiny", "--out", str(csv), "--cpu-threads", "1", "--repeats", "2",
         "--prefill-chunks", "16,64", "--decode-batches", "1,8", "--contexts", "0,64,256"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["costmodel", "fit", str(csv), "--out", str(yaml_), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["groups"]
    prof = load_profile(str(yaml_))
    res = runner.invoke(
        app, ["simulate", "--profile", str(yaml_), "--duration", "5", "--rate", "2", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["finished"] > 0
    assert prof.cost_model().decode_time(8, 8 * 64) > 0


def test_profile_rejects_bad_lists(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-m", "sloserve.cli", "profile", "tiny", "--out", str(tmp_path / "x.csv"),
         "--decode-batches", "1,a"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and "--decode-batches" in proc.stderr
