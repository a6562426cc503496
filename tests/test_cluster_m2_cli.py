"""Cluster milestone 2 from the command line: --trace-decisions, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cli_helpers import assert_user_error, cli_argv, run_many, write


def test_trace_decisions_writes_decisions_parquet(tmp_path: Path) -> None:
    out = tmp_path / "r"
    argv = cli_argv(
        "simulate",
        "--replicas",
        "2",
        "--router",
        "least-loaded",
        "--rate",
        "6",
        "--duration",
        "5",
        "--trace-decisions",
        "--out",
        str(out),
        "--json",
    )
    proc = run_many({"x": argv})["x"]
    assert proc.returncode == 0, proc.stderr
    d = pd.read_parquet(out / "decisions.parquet")
    t = pd.read_parquet(out / "requests.parquet")
    assert len(d) == len(t) and set(d["pick"]) <= {0, 1}
    assert {"score_outstanding", "score_kv", "candidates", "queue_s"} <= set(d.columns)


@pytest.mark.parametrize(
    ("yaml", "needle"),
    [
        ("cluster: {admission: {kind: token-bucket, rate: -1, burst: 2}}\n", "admission.rate"),
        ("cluster: {admission: {kind: shed}}\n", "needs max_live"),
        (
            "cluster: {replicas: [{role: prefill}]}\n",
            "disaggregated serving needs prefill and decode groups",
        ),
        (
            "cluster: {model_swaps: [{replica: 0, at_s: 1, model: nope}]}\n",
            "cluster.model_swaps.0.model: unknown model 'nope'",
        ),
        (
            "workload: {duration_s: 5, models: {nope: 1}}\ncluster: {}\n",
            "workload.models: model 'nope'",
        ),
        (
            "cluster: {autoscaler: {min: 2, max: 4}}\n",
            "cluster.autoscaler: group 0 starts with 1 replicas, outside min 2..max 4",
        ),
    ],
)
def test_bad_m2_input_is_one_line(tmp_path: Path, yaml: str, needle: str) -> None:
    cfg = write(tmp_path / "c.yaml", yaml)
    proc = run_many({"x": cli_argv("simulate", "--duration", "5", "--config", cfg)})["x"]
    assert_user_error(proc, needle)
