"""``benchmarks/execute_gpu.py --smoke`` runs on a CPU in seconds and writes its report.

The one benchmark the tests run: it exists for a GPU machine, where a broken import or a
renamed field would only show when GPU time is spent on it. The smoke run (the tiny model,
one load, two requests per policy) exercises every step of the GPU run: calibration,
execute runs under each policy, re-pricing against the calibrated profile, simulations,
the JSON and Markdown reports.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "execute_gpu.py"


def test_smoke_run_writes_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    argv = [str(SCRIPT), "--out", str(tmp_path), "--smoke", "--rates", "4", "--requests", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(SCRIPT), run_name="__main__")
    rep = json.loads((tmp_path / "execute_gpu.json").read_text())
    assert rep["model"] == "tiny" and rep["device"] == "cpu"
    assert [r["policy"] for r in rep["runs"]] == ["vllm", "sarathi", "andes"]
    for r in rep["runs"]:
        assert r["requests"] == 2 and r["rate"] == 4.0 and r["iterations"] > 0
        for against in ("vs_shipped", "vs_calibrated"):
            assert r[against]["all"]["iterations"] == r["iterations"]
        assert r["measured_tokens_per_s"] > 0 and r["simulated_tokens_per_s_calibrated"] > 0
    assert (tmp_path / "calibrated.yaml").is_file()
    md = (tmp_path / "execute_gpu.md").read_text()
    assert md.count("\n| ") == 4  # the header and one row per policy
