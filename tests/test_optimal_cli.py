"""``sloserve optimal``: the JSON summary, schedule export and engine replay, and errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from sloserve.cli import app

RUN = CliRunner()
TINY = [
    "--requests",
    "2",
    "--input",
    "3",
    "--output",
    "2",
    "--kv-capacity",
    "6",
    "--workers",
    "1",
    "--deterministic-limit",
    "20",
]
KEYS = {"status", "objective", "latency", "evictions", "num_batches", "gap", "solve_seconds"}


def _json(args: list[str]) -> dict[str, Any]:
    res = RUN.invoke(app, ["optimal", *args, "--json"])
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def test_solve_export_and_replay(tmp_path: Path) -> None:
    path = tmp_path / "sched.json"
    out = _json([*TINY, "--schedule-out", str(path)])
    assert set(out) >= KEYS
    assert out["status"] == "optimal" and out["gap"] == 0.0
    assert out["evictions"] == 1  # M = 6 fits two prompts, not both to their last token
    assert out["replay_matches"] is True
    assert abs(out["engine_latency"] - out["objective"]) < 1e-6 * out["objective"]
    doc = json.loads(path.read_text())
    assert len(doc["batches"]) == out["num_batches"]
    rep = _json(["--replay", str(path)])
    assert rep["replay_matches"] is True and rep["all_finished"] is True
    assert rep["engine_latency"] == rep["latency"]
    assert rep["engine_preemptions"] == out["evictions"]
    assert rep["objective"] == out["objective"]
    assert rep["objective_name"] == "latency"
    assert abs(rep["objective_priced"] - rep["objective"]) < 1e-6 * rep["objective"]


def test_options_change_the_answer() -> None:
    free = _json([*TINY, "--no-eviction"])
    assert free["evictions"] == 0 and free["status"] == "optimal"
    best = _json(TINY)
    assert best["latency"] < free["latency"]
    never = _json([*TINY, "--better-than", "vllm-ef", "--by", "60"])
    assert never["status"] == "infeasible" and never["latency"] is None
    must = _json([*TINY, "--min-evictions", "1"])
    assert must["evictions"] >= 1
    need = best["batches_needed"]
    assert isinstance(need, int) and need >= best["num_batches"]
    glob = _json([*TINY, "--max-batches", str(need)])
    assert glob["batches_sufficient"] is True and glob["status"] == "optimal"
    assert abs(glob["latency"] - best["latency"]) < 1e-9
    mk = _json([*TINY, "--objective", "makespan", "--warm-start", "none"])
    assert mk["status"] == "optimal" and mk["warm_start"] is None
    assert abs(mk["objective"] - mk["makespan"]) < 1e-6 * mk["makespan"]


def test_human_output_lists_batches() -> None:
    res = RUN.invoke(app, ["optimal", *TINY])
    assert res.exit_code == 0, res.output
    assert "optimal" in res.output and "batch   0" in res.output and "matches" in res.output


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sloserve.cli", "optimal", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "nope"}')
    for args in (
        ["--requests", "2", "--input", "3"],
        [*TINY[:6], "--kv-capacity", "3"],
        [*TINY, "--objective", "fairness"],
        [*TINY, "--no-eviction", "--min-evictions", "1"],
        ["--replay", str(bad)],
    ):
        p = _cli(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_human_output_says_when_optimal_is_only_within_j() -> None:
    args = ["--requests", "3", "--input", "3", "--output", "3", "--kv-capacity", "7"]
    res = RUN.invoke(app, ["optimal", *args, *TINY[8:], "--max-batches", "8"])
    assert res.exit_code == 0, res.output
    caption, first = res.output.splitlines()[:2]  # the JSON says batches_sufficient false
    assert caption.startswith("workload uniform (3 requests) | profile"), caption
    assert first.startswith("optimal within J = 8 batches only (global needs J >= 9)"), first


def test_more_bad_input_is_a_typed_error(tmp_path: Path) -> None:
    from sloserve.core.errors import SloserveError

    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00binary")
    for args in (
        ["--replay", str(binary), "--cost-model", "constant:0.01"],
        [*TINY, "--cost-model", "constant:inf"],
        ["--requests", "2", "--input", "1000000000", "--output", "2"],
        ["--requests", "3", "--input", "1", "--output", "100000"],
    ):
        res = RUN.invoke(app, ["optimal", *args])
        # main() turns a SloserveError into one line and exit status 2
        assert isinstance(res.exception, SloserveError) or res.exit_code == 2, (args, res.exception)
