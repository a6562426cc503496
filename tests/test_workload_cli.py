"""``sloserve workload describe|export`` and the trace flags of ``simulate``: in process with
typer's CliRunner, and through the real entry point (``python -m sloserve.cli``, a
subprocess) for the export → replay round trip and the one-line-error / exit-2 contract.

The real trace used here is the Azure LLM inference trace 2023 (conversation service),
Microsoft Azure Public Dataset (Azure/AzurePublicDataset), licensed CC-BY 4.0. It is read
from the shared folder next to the repository, never copied into it; its tests are skipped
without it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner, Result

from cli_helpers import assert_user_error, cli_argv, run_main, run_many, write
from sloserve import cli
from sloserve.cli import app
from sloserve.costmodel.profile import load_profile
from sloserve.experiments.runner import SimConfig, workload_requests
from sloserve.workloads import PoissonArrivals, WorkloadSpec, build_requests
from sloserve.workloads.loaders import load_azure
from sloserve.workloads.spec import ReplayOptions, build_workload

AZURE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023_conv.csv"
needs_azure = pytest.mark.skipif(
    not AZURE.is_file(),
    reason=f"the Azure LLM trace is not at {AZURE} (shared data, not in the repo)",
)
AZ = ["--trace", str(AZURE), "--trace-format", "azure"]
# simulated time independent of the (concurrently re-fitted) profile cost models
FAST = ["--cost-model", "constant:0.01"]


# ----------------------------------------------------------------------------- helpers
@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A console wide enough that rich does not ellipsize table cells."""
    monkeypatch.setattr(cli.console, "_width", 250)


def invoke(*args: str | Path) -> Result:
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exit_code != 0:
        raise AssertionError(
            f"exit {result.exit_code}: {result.output}\n{result.exception!r}"
        ) from result.exception
    return result


def invoke_json(*args: str | Path) -> Any:
    def no_nan(c: str) -> None:
        raise AssertionError(f"not strict JSON: {c}")

    return json.loads(invoke(*args, "--json").stdout, parse_constant=no_nan)




@pytest.fixture(scope="module")
def azure_arrivals() -> np.ndarray:
    if not AZURE.is_file():
        pytest.skip(f"the Azure LLM trace is not at {AZURE}")
    return load_azure(AZURE).df["arrival_s"].to_numpy()


# ----------------------------------------------------------------------------- describe
@needs_azure
def test_describe_azure_json() -> None:
    d = invoke_json("workload", "describe", *AZ)
    assert d["requests"] == 19_366
    assert d["mean_rate_per_s"] == pytest.approx(5.5, abs=0.1)
    assert 3_450 < d["span_s"] < 3_600
    assert d["prompt_tokens"]["mean"] == pytest.approx(1_155, abs=1)
    assert d["prompt_tokens"]["max"] == 14_050
    assert d["output_tokens"]["mean"] == pytest.approx(211, abs=1)
    assert d["output_tokens"]["max"] == 1_000
    assert d["classes"] == {"rt": 19_366}
    assert d["notes"] == []
    rot = d["rate_over_time"]
    assert rot["bin_s"] == 300.0 and len(rot["rate_per_s"]) == 12
    # every bin but the last covers bin_s seconds; the last one what is left of the span
    widths = np.minimum(np.asarray(rot["start_s"]) + rot["bin_s"], d["span_s"]) - rot["start_s"]
    assert float(np.asarray(rot["rate_per_s"]) @ widths) == pytest.approx(19_366)


@needs_azure
def test_describe_azure_text(wide: None) -> None:
    out = invoke("workload", "describe", *AZ, "--bin", "600").stdout
    assert "19366 requests over 3501.7 s" in out
    # the percentile table
    header = next(line for line in out.splitlines() if "mean" in line and "p99" in line)
    assert re.findall(r"\w+", header) == ["tokens", "mean", "std", "p50", "p90", "p99", "max"]
    rows = {
        line.split()[1]: line
        for line in out.splitlines()
        if re.match(r"^\W*(prompt|output|total)\b", line)
    }
    assert set(rows) == {"prompt", "output", "total"}
    assert "1155" in rows["prompt"] and "14050" in rows["prompt"]
    assert "211" in rows["output"] and "1000" in rows["output"]
    assert "mean rate 5.530 req/s" in out
    # the rate-over-time bars: one line per 600 s bin, the busiest one 40 marks wide
    assert "rate over time, 600 s bins (req/s):" in out
    bars = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+(#+)$", out, flags=re.MULTILINE)
    assert [int(b[0]) for b in bars] == [0, 600, 1200, 1800, 2400, 3000]
    assert max(len(b[2]) for b in bars) == 40
    rates = [float(b[1]) for b in bars]
    for rate, (_, _, marks) in zip(rates, bars, strict=True):
        assert len(marks) == round(40 * rate / max(rates))
    assert "classes: {'rt': 19366}" in out


@needs_azure
def test_describe_plot_writes_png(tmp_path: Path, wide: None) -> None:
    png = tmp_path / "azure.png"
    out = invoke("workload", "describe", *AZ, "--window-end", "600", "--plot", png).stdout
    assert png.is_file() and png.stat().st_size > 1_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {png}" in out.replace("\n", "")


@needs_azure
def test_describe_replay_flags_reach_the_workload(azure_arrivals: np.ndarray) -> None:
    args = ["--window-start", "600", "--window-end", "900", "--sample", "0.5"]
    args += ["--max-context", "2048", "--slo", "qlm", "--reading-speed", "listening", "--seed", "1"]
    d = invoke_json("workload", "describe", *AZ, *args)
    inside = int(((azure_arrivals >= 600) & (azure_arrivals < 900)).sum())
    spec = WorkloadSpec(
        trace=str(AZURE),
        trace_format="azure",
        replay=ReplayOptions(start_s=600, end_s=900, sample=0.5, max_context=2048),
        max_context=2048,
        slo="qlm",
        qoe={"tokens_per_s": "listening"},  # type: ignore[arg-type]
        seed=1,
    )
    w = build_workload(spec)
    assert d["requests"] == len(w.requests)
    assert d["requests"] / inside == pytest.approx(0.5, abs=0.05)
    assert d["notes"] == w.notes
    notes = " | ".join(d["notes"])
    assert f"window [600.0, 900.0) s keeps {inside} of 19366" in notes
    assert "sampled 50%" in notes and "to 2048 tokens" in notes
    assert d["total_tokens"]["max"] <= 2048
    assert d["slo"] == {"ttft_slo_s": None, "tpot_slo_s": None, "deadline_s": 30.0}
    assert d["qoe_tokens_per_s"]["mean"] == pytest.approx(3.3, abs=0.15)
    assert d["span_s"] < 300


@needs_azure
def test_describe_trace_use_lengths() -> None:
    d = invoke_json(
        "workload", "describe", *AZ, "--trace-use", "lengths", "--rate", "4", "--duration", "100"
    )
    n = len(
        build_requests(
            WorkloadSpec(
                trace=str(AZURE),
                trace_format="azure",
                trace_use="lengths",
                arrival=PoissonArrivals(rate=4),
                duration_s=100,
            )
        )
    )
    assert d["requests"] == n
    assert 330 < n < 470
    assert d["span_s"] < 100
    assert d["prompt_tokens"]["max"] <= 14_050 and d["output_tokens"]["max"] <= 1_000


def test_describe_other_formats(tmp_path: Path) -> None:
    table = write(
        tmp_path / "t.csv", "ts,in,out\n2024-01-01T00:00:03,10,5\n2024-01-01T00:00:01,20,6\n"
    )
    cols = "arrival_s=ts,prompt_tokens=in,output_tokens=out"
    d = invoke_json(
        "workload",
        "describe",
        "--trace",
        table,
        "--trace-format",
        "table",
        "--columns",
        cols,
        "--no-strict",
    )
    assert d["requests"] == 2 and d["span_s"] == 2.0
    assert d["notes"] == ["1 out-of-order arrival(s) sorted"]
    burst = write(
        tmp_path / "b.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "0,ChatGPT,10,5,15,Conversation log\n1,ChatGPT,12,0,12,API log\n2.5,GPT-4,14,7,21,API log\n",
    )
    d = invoke_json("workload", "describe", "--trace", burst, "--trace-format", "burstgpt")
    assert d["requests"] == 2
    assert d["notes"] == ["dropped 1 failed request(s) (0 response tokens)"]
    sg = write(
        tmp_path / "sg.json",
        json.dumps(
            [
                {
                    "id": "x",
                    "conversations": [
                        {"from": "human", "value": "a b c d e f g h i j"},
                        {"from": "gpt", "value": "k l m"},
                    ],
                }
            ]
        ),
    )
    d = invoke_json(
        "workload", "describe", "--trace", sg, "--trace-format", "sharegpt", "--tokenizer", "words",
        "--rate", "2", "--duration", "10",
    )  # fmt: skip
    assert d["prompt_tokens"]["max"] == d["prompt_tokens"]["min"] == 13  # 10 words × 1.3
    assert d["output_tokens"]["max"] == 4  # round(3 × 1.3)
    assert any("1.3 tokens per word" in n for n in d["notes"])
    assert any("no arrival times" in n for n in d["notes"])


# ----------------------------------------------------------------------------- export
def test_export_then_simulate_replays_the_same_requests(tmp_path: Path) -> None:
    """Both through the real entry point."""
    f = tmp_path / "lmsys.csv"
    exp = run_many(
        {
            "export": cli_argv(
                "workload",
                "export",
                "--out",
                f,
                "--workload",
                "lmsys",
                "--rate",
                "3",
                "--duration",
                "20",
            )
        }
    )["export"]
    assert exp.returncode == 0, exp.stderr
    n = len(pd.read_csv(f))
    assert re.search(rf"\b{n} requests written to", exp.stdout.replace("\n", ""))
    spec = WorkloadSpec(mix="lmsys", arrival=PoissonArrivals(rate=3), duration_s=20)
    expected = workload_requests(SimConfig(workload=spec))  # what the CLI builds
    assert n == len(expected) > 30
    sim = run_many({"sim": cli_argv("simulate", "--trace", f, "--slo", "none", "--json", *FAST)})[
        "sim"
    ]
    assert sim.returncode == 0, sim.stderr
    s = json.loads(sim.stdout)
    assert s["requests"] == n
    assert s["finished"] + s.get("rejected", 0) == n
    assert s["workload_notes"] == []
    df = pd.read_csv(f)
    assert df["prompt_tokens"].tolist() == [r.num_prompt_tokens for r in expected]
    assert df["output_tokens"].tolist() == [r.true_output_len for r in expected]
    assert (df["class"] == "rt").all() and (df["ttft_slo_s"] == 0.4).all()


def test_export_matches_describe_and_notes_batch_jobs(tmp_path: Path, wide: None) -> None:
    f = tmp_path / "w.csv"
    cfg = write(
        tmp_path / "batch.yaml",
        "workload:\n  mix: sharegpt\n  duration_s: 10\n  batch_jobs:\n    batch_size: 4\n    num_batches: 2\n",
    )
    out = invoke("workload", "export", "--out", f, "--config", cfg, "--rate", "2").stdout
    assert "closed-loop batch jobs depend on the server and are not in the file" in out.replace(
        "\n", " "
    )
    d = invoke_json("workload", "describe", "--config", cfg, "--rate", "2")
    assert len(pd.read_csv(f)) == d["requests"]
    assert "closed-loop batch jobs are submitted during a run: not counted here" in d["notes"]


# ----------------------------------------------------------------------------- simulate
@needs_azure
def test_simulate_azure_window_and_speedup(azure_arrivals: np.ndarray) -> None:
    s = invoke_json("simulate", *AZ, "--window-end", "120", "--speedup", "2", *FAST)
    n = int((azure_arrivals < 120).sum())
    assert s["requests"] == n
    assert s["requests"] / 120 == pytest.approx(5.5, rel=0.4)
    assert s["workload_notes"] == [
        f"window [0.0, 120.0) s keeps {n} of 19366 requests",
        "replayed 2.0× faster",
    ]
    reqs = build_workload(
        WorkloadSpec(trace=str(AZURE), trace_format="azure", replay=ReplayOptions(end_s=120))
    ).requests
    context = load_profile("llama-2-7b-a100").model.max_context
    too_long = sum(r.num_prompt_tokens + r.true_output_len > context for r in reqs)
    assert too_long > 0
    assert s["rejected"] == too_long
    assert s["finished"] == n - too_long


@needs_azure
def test_simulate_azure_text_reports_rejections(wide: None) -> None:
    out = invoke("simulate", *AZ, "--window-end", "120", "--speedup", "2", *FAST).stdout
    assert re.search(r"\d+ requests, \d+ s simulated", out)
    m = re.search(
        r"vllm: (\d+) request\(s\) rejected, e\.g\. prompt\+output (\d+) tokens exceeds the model context (\d+)",
        out,
    )
    assert m, out
    assert int(m.group(1)) > 0 and int(m.group(2)) > int(m.group(3))


# ----------------------------------------------------------------------------- bad inputs
@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("trace_inputs")
    burst_header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    return {
        "azure": write(
            d / "az.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:15:46.50,374,44\n2023-11-16 18:15:47.00,10,5\n",
        ),
        "unsorted": write(
            d / "az_unsorted.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:15:48.00,374,44\n2023-11-16 18:15:47.00,10,5\n",
        ),
        "table": write(d / "t.csv", "t,p,o\n0,10,5\n1,20,6\n"),
        "failures": write(
            d / "only_failures.csv",
            burst_header + "0,ChatGPT,10,0,10,API log\n1,GPT-4,20,0,20,Conversation log\n",
        ),
        "some_failures": write(
            d / "some_failures.csv",
            burst_header + "0,ChatGPT,10,4,14,API log\n1,GPT-4,20,0,20,Conversation log\n",
        ),
    }


ERROR_CASES: list[tuple[str, list[str], list[str]]] = [
    (
        "unknown-trace-format",
        ["simulate", "--trace", "{azure}", "--trace-format", "parquet"],
        ["trace_format", "parquet", "azure", "burstgpt"],
    ),
    (
        "bad-columns",
        ["simulate", "--trace", "{table}", "--trace-format", "table", "--columns", "arrival_s:t"],
        ["columns", "name=column", "arrival_s:t"],
    ),
    (
        "columns-missing-mapping",
        [
            "workload",
            "describe",
            "--trace",
            "{table}",
            "--trace-format",
            "table",
            "--columns",
            "arrival_s=t",
        ],
        ["t.csv", "output_tokens", "prompt_tokens"],
    ),
    (
        "sample-zero",
        ["simulate", "--trace", "{azure}", "--trace-format", "azure", "--sample", "0"],
        ["sample", "must be > 0"],
    ),
    (
        "speedup-negative",
        ["simulate", "--trace", "{azure}", "--trace-format", "azure", "--speedup", "-1"],
        ["speedup", "-1"],
    ),
    (
        "slo-bogus",
        ["simulate", "--trace", "{azure}", "--trace-format", "azure", "--slo", "bogus"],
        ["slo", "bogus", "bros", "qlm", "none"],
    ),
    (
        "burstgpt-only-failures",
        ["simulate", "--trace", "{failures}", "--trace-format", "burstgpt"],
        ["only_failures.csv", "no successful requests"],
    ),
    (
        "burstgpt-keep-failures",
        [
            "workload",
            "describe",
            "--trace",
            "{some_failures}",
            "--trace-format",
            "burstgpt",
            "--keep-failures",
        ],
        ["some_failures.csv", "line 3", "Response tokens", "0 response tokens"],
    ),
    (
        "unsorted-strict",
        [
            "workload",
            "export",
            "--out",
            "{table}.out",
            "--trace",
            "{unsorted}",
            "--trace-format",
            "azure",
        ],
        ["az_unsorted.csv", "line 3", "not sorted", "--no-strict"],
    ),
    (
        "window-reversed",
        [
            "simulate",
            "--trace",
            "{azure}",
            "--trace-format",
            "azure",
            "--window-start",
            "9",
            "--window-end",
            "3",
        ],
        ["end_s", "start_s"],
    ),
    (
        "trace-use-bogus",
        [
            "workload",
            "describe",
            "--trace",
            "{azure}",
            "--trace-format",
            "azure",
            "--trace-use",
            "both",
        ],
        ["trace_use", "both", "replay", "lengths"],
    ),
    (
        "window-empties-trace",
        ["simulate", "--trace", "{azure}", "--trace-format", "azure", "--window-start", "100"],
        ["az.csv", "no request left"],
    ),
]

# Run through the real entry point too (in parallel, one subprocess each).
ENTRY_POINT_CASES = {
    "unknown-trace-format",
    "bad-columns",
    "sample-zero",
    "speedup-negative",
    "slo-bogus",
    "burstgpt-only-failures",
}


@pytest.mark.parametrize(("name", "args", "needles"), ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_bad_inputs_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    files: dict[str, Path],
    name: str,
    args: list[str],
    needles: list[str],
) -> None:
    argv = [a.format(**files) for a in args]
    assert_user_error(run_main(monkeypatch, capsys, *argv), *needles)


@pytest.fixture(scope="module")
def entry(files: dict[str, Path]) -> dict[str, subprocess.CompletedProcess[str]]:
    return run_many(
        {
            name: cli_argv(*[a.format(**files) for a in args])
            for name, args, _ in ERROR_CASES
            if name in ENTRY_POINT_CASES
        }
    )


@pytest.mark.parametrize(
    ("name", "needles"),
    [(c[0], c[2]) for c in ERROR_CASES if c[0] in ENTRY_POINT_CASES],
    ids=[c[0] for c in ERROR_CASES if c[0] in ENTRY_POINT_CASES],
)
def test_bad_inputs_entry_point(
    entry: dict[str, subprocess.CompletedProcess[str]], name: str, needles: list[str]
) -> None:
    assert_user_error(entry[name], *needles)


def test_no_strict_flag_sorts(files: dict[str, Path]) -> None:
    d = invoke_json(
        "workload",
        "describe",
        "--trace",
        files["unsorted"],
        "--trace-format",
        "azure",
        "--no-strict",
    )
    assert d["requests"] == 2
    assert d["notes"] == ["1 out-of-order arrival(s) sorted"]
