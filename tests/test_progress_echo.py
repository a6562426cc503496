"""The progress bar of long commands (shown on a terminal only) and the echo of what a run
ran (a caption above its table, a ``"run"`` key in its JSON)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sloserve.cli import app
from sloserve.cli._progress import is_quiet, progress_bar, timed_bar
from sloserve.experiments.report import run_caption, run_info
from sloserve.experiments.runner import SimConfig

SHORT = ["--duration", "10", "--rate", "2", "--cost-model", "constant:0.01"]


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=100), buf


def test_bar_is_drawn_on_a_terminal() -> None:
    con, buf = _console(True)
    with progress_bar("simulating", console=con) as bar:
        bar(3, 8)
        bar._progress.refresh()  # type: ignore[union-attr]
    out = buf.getvalue()
    assert "simulating" in out and "3/8" in out and "ETA" in out


def test_bar_is_quiet_off_a_terminal_and_under_json() -> None:
    con, buf = _console(False)
    assert is_quiet(console=con)
    with progress_bar("simulating", console=con) as bar:
        bar(3, 8)
        bar.stage("other", 1, 2)
    assert buf.getvalue() == ""
    term, tbuf = _console(True)
    assert is_quiet(True, term) and not is_quiet(False, term)
    with progress_bar("simulating", as_json=True, console=term) as bar:
        bar(3, 8)
    assert tbuf.getvalue() == ""


def test_stages_get_a_line_each() -> None:
    con, buf = _console(True)
    with progress_bar("x", console=con) as bar:
        bar.stage("contention", 2, 4)
        bar.stage("eviction", 1, 5)
        bar._progress.refresh()  # type: ignore[union-attr]
    out = buf.getvalue()
    assert "contention" in out and "2/4" in out and "eviction" in out and "1/5" in out


def test_timed_bar_fills_with_time() -> None:
    con, buf = _console(True)
    import time

    with timed_bar("solving", 0.6, console=con):
        time.sleep(0.5)
    assert "solving" in buf.getvalue()
    quiet, qbuf = _console(False)
    with timed_bar("solving", 0.6, console=quiet):
        pass
    assert qbuf.getvalue() == ""


def test_compare_json_and_pipe_output_carry_no_bar() -> None:
    # CliRunner's output is not a terminal: no bar characters, JSON stays parseable
    r = CliRunner().invoke(app, ["compare", "--policies", "vllm,sarathi", *SHORT, "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert list(data) == ["vllm", "sarathi", "run"]
    r = CliRunner().invoke(app, ["compare", "--policies", "vllm,sarathi", *SHORT])
    assert "━" not in r.stdout.split("┏")[0]  # nothing drawn before the table but the caption


def test_run_info_names_what_ran() -> None:
    cfg = SimConfig.model_validate(
        {
            "workload": {
                "mix": "lmsys",
                "arrival": {"kind": "gamma", "rate": 3, "cv": 2},
                "duration_s": 30,
                "slo": {"rt": {"ttft_s": 0.5, "tpot_s": 0.1}},
                "seed": 7,
            },
            "instance": {"profile": "llama-2-7b-a100"},
            "policy": "edf",
        }
    )
    info = run_info(cfg)
    assert info["workload"] == "lmsys" and info["seed"] == 7 and info["policy"] == "edf"
    assert info["arrival"] == {"kind": "gamma", "rate": 3.0, "cv": 2.0}
    assert info["slo"] == {"rt": {"ttft_s": 0.5, "tpot_s": 0.1}}
    cap = run_caption(info)
    for part in (
        "workload lmsys",
        "gamma rate=3 cv=2",
        "30 s",
        "profile llama-2-7b-a100",
        "policy edf",
        "rt ttft<=0.5s tpot<=0.1s",
        "seed 7",
    ):
        assert part in cap, (part, cap)
    assert "\n" not in cap
    assert "policy vllm, edf" in run_caption(run_info(cfg, ["vllm", "edf"]))


@pytest.mark.parametrize("cmd", ["simulate", "compare"])
def test_table_and_json_echo_the_run(cmd: str) -> None:
    extra = ["--policies", "vllm,edf"] if cmd == "compare" else ["--policy", "edf"]
    args = [cmd, *extra, *SHORT, "--seed", "4", "--workload", "lmsys"]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    run: dict[str, Any] = json.loads(r.stdout)["run"]
    assert run["seed"] == 4 and run["workload"] == "lmsys" and run["slo"] == "bros"
    assert run["profile"] == "llama-2-7b-a100"
    r = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    first = r.stdout.splitlines()[0]
    assert first.startswith("workload lmsys (poisson rate=2, 10 s)") and "seed 4" in first
    assert "policy vllm, edf" in first if cmd == "compare" else "policy edf" in first


def test_optimal_echoes_what_it_solved() -> None:
    pytest.importorskip("ortools")
    args = ["optimal", "--requests", "2", "--input", "8", "--output", "2", "--kv-capacity", "32"]
    r = CliRunner().invoke(app, [*args, "--solver-seed", "3", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["status"] == "optimal"  # the summary's keys are still there
    assert out["run"] == {
        "workload": "uniform",
        "requests": 2,
        "profile": "llama-2-7b-a100",
        "policy": "optimal (CP-SAT)",
        "objective": "latency",
        "slo": None,
        "seed": 3,
        "time_limit_s": 10.0,
    }
    r = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert r.stdout.splitlines()[0].startswith("workload uniform (2 requests) | profile")
