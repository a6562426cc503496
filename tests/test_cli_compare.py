"""``sloserve compare`` in process: the report it writes (requests / trace Parquet,
summary and config JSON, plots), its printed table, its JSON output, and agreement
with ``simulate`` on the same workload."""

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
from sloserve import cli


# ----------------------------------------------------------------------------- compare
@pytest.fixture(scope="module")
def compare_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out_dir = tmp_path_factory.mktemp("cmp") / "report"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli.console, "_width", 250)
        res = invoke(
            "compare", "--policies", "vllm,sarathi", *SHORT, "--seed", "1", "--out", out_dir
        )
    return out_dir, res.stdout


def test_compare_writes_report_files(compare_run: tuple[Path, str]) -> None:
    out_dir, _ = compare_run
    for f in REPORT_FILES:
        p = out_dir / f
        assert p.is_file() and p.stat().st_size > 0, f
    for f in ("cdf_ttft.png", "cdf_tpot.png", "cdf_qoe.png", "timeline.png"):
        assert (out_dir / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_requests_parquet(compare_run: tuple[Path, str]) -> None:
    out_dir, _ = compare_run
    df = pd.read_parquet(out_dir / "requests.parquet")
    assert "policy" in df.columns
    assert set(df["policy"]) == {"vllm", "sarathi"}
    summary = json.loads((out_dir / "summary.json").read_text())
    n = summary["vllm"]["requests"]
    assert n > 20
    assert summary["sarathi"]["requests"] == n
    assert len(df) == 2 * n
    by = {p: g.sort_values("req_id") for p, g in df.groupby("policy")}
    for g in by.values():
        assert g["req_id"].tolist() == list(range(n))
    # the very same requests for both policies
    for col in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert by["vllm"][col].tolist() == by["sarathi"][col].tolist()


def test_compare_trace_parquet(compare_run: tuple[Path, str]) -> None:
    out_dir, _ = compare_run
    tr = pd.read_parquet(out_dir / "trace.parquet")
    assert {"policy", "time", "running", "waiting", "kv_usage"} <= set(tr.columns)
    assert set(tr["policy"]) == {"vllm", "sarathi"}
    assert tr["kv_usage"].between(0, 1).all()


def test_compare_summary_and_config_json(compare_run: tuple[Path, str]) -> None:
    out_dir, _ = compare_run
    summary = json.loads((out_dir / "summary.json").read_text())
    assert set(summary) == {"vllm", "sarathi"}
    for name, s in summary.items():
        assert set(s) >= SUMMARY_KEYS
        assert s["policy"] == name
        assert s["seed"] == 1
    config = json.loads((out_dir / "config.json").read_text())
    assert config["policies"] == ["vllm", "sarathi"]
    assert config["config"]["workload"]["arrival"] == {"kind": "poisson", "rate": 2.0}
    assert config["config"]["workload"]["duration_s"] == 30.0
    assert config["config"]["workload"]["seed"] == 1


def test_compare_prints_table(compare_run: tuple[Path, str]) -> None:
    _, out = compare_run
    assert "vllm" in out and "sarathi" in out
    assert "same arrivals for every policy" in out
    assert "report written to" in out


def test_compare_json() -> None:
    s = invoke_json("compare", "--policies", "vllm, edf ,rank-input", *SHORT, *FAST)
    assert list(s) == ["vllm", "edf", "rank-input", "run"]  # what ran, beside the summaries
    assert s.pop("run")["policy"] == ["vllm", "edf", "rank-input"]
    counts = {v["requests"] for v in s.values()}
    assert len(counts) == 1
    for name, v in s.items():
        assert v["policy"] == name
        assert v["finished"] == v["requests"]


def test_compare_matches_simulate() -> None:
    c = invoke_json("compare", "--policies", "vllm,sarathi", *SHORT, *FAST)
    s = invoke_json("simulate", "--policy", "sarathi", *SHORT, *FAST)
    assert s.pop("run")["policy"] == "sarathi"
    assert drop_wall(c["sarathi"]) == drop_wall(s)
