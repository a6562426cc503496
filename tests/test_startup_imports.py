"""`simulate --json` imports no heavy library it does not use (issue 14: start-up time).

Not a timing test: each run is a fresh interpreter under ``-X importtime``, which lists
every module it imports; the heavy ones must not be among them. A table, a report folder
(``--out``) or a plot still imports them where they are used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("pandas", "matplotlib", "scipy", "pyarrow", "torch", "fastapi", "ortools", "ray")
"""Top-level packages a --json simulation must not import."""


def _imported(args: list[str], tmp_path: Path) -> tuple[set[str], dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sloserve.cli", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    mods = {
        line.rsplit("|", 1)[1].strip()
        for line in res.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return mods, json.loads(res.stdout)


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    rows = ["arrival_s,prompt_tokens,output_tokens,class,priority,model,ttft_slo_s"]
    rows += [f"{0.25 * i},{100 + 7 * i},{20 + i % 9},rt,0,default," for i in range(40)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "--workload", "sharegpt", "--rate", "4", "--duration", "5"],
        ["simulate", "--policy", "sarathi", "--trace", "TRACE"],
        ["simulate", "--trace", "TRACE", "--replicas", "2", "--router", "least-outstanding"],
    ],
    ids=["mix", "trace", "cluster"],
)
def test_simulate_json_imports_no_heavy_library(tmp_path: Path, args: list[str]) -> None:
    trace = str(_trace(tmp_path))
    mods, summary = _imported([trace if a == "TRACE" else a for a in args], tmp_path)
    assert summary["finished"] > 0  # it ran
    assert "sloserve.cli.run" in mods  # the listing is real
    heavy = sorted(m for m in mods if m.split(".")[0] in HEAVY)
    assert not heavy, f"imported by a --json simulation: {heavy[:8]}"


def test_out_still_writes_the_report(tmp_path: Path) -> None:
    """The libraries come back where they are used: --out writes parquet (pandas)."""
    trace = str(_trace(tmp_path))
    mods, _ = _imported(["simulate", "--trace", trace, "--out", str(tmp_path / "r")], tmp_path)
    assert "pandas" in mods
    assert (tmp_path / "r" / "requests.parquet").exists()


def test_importing_the_cli_imports_no_experiment_module() -> None:
    """Every command pays the CLI's import; the experiments package (its ``__init__``
    imports the runner, ≈ 60 ms) is imported by the commands that run something, when
    they run (the import freeze's bookkeeping is in ``core/process_freeze.py`` for this)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    code = (
        "import sys, sloserve.cli\n"
        "print(sorted(m for m in sys.modules if m.startswith('sloserve.experiments')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
    assert out == "[]"
