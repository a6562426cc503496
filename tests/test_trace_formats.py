"""Mooncake JSONL traces, format detection, and the vLLM custom-dataset export.

The real Mooncake traces (kvcache-ai/Mooncake, FAST25-release/traces/, Apache-2.0) are read
from ../shared/traces/, never copied.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cli_helpers import cli_argv, run_many
from sloserve.core.errors import WorkloadError
from sloserve.experiments.runner import SimConfig, simulate
from sloserve.workloads.detect import detect_format
from sloserve.workloads.loaders import load_trace
from sloserve.workloads.spec import ReplayOptions, WorkloadSpec, build_workload
from sloserve.workloads.vllm_export import export_vllm_jsonl

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
MOONCAKE = SHARED / "mooncake_conversation_trace.jsonl"
AZURE = SHARED / "azure_llm_2023_conv.csv"


def write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


def lines(*objs: object) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


def test_mooncake_small_file_by_hand(tmp_path: Path) -> None:
    p = write(
        tmp_path / "m.jsonl",
        lines(
            {"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]},
            {"timestamp": 1000, "input_length": 10, "output_length": 1},
            {"timestamp": 3500, "input_length": 512, "output_length": 2, "hash_ids": [7]},
        )
        + "\n",  # a blank line is skipped
    )
    t = load_trace(p, "mooncake")
    assert t.df["arrival_s"].tolist() == [0.0, 0.0, 2.5]  # ms -> s, from the first
    assert t.df["prompt_tokens"].tolist() == [600, 10, 512]
    assert t.df["output_tokens"].tolist() == [5, 1, 2]
    assert t.df["hash_ids"].tolist() == [(7, 8), None, (7,)]
    w = build_workload(WorkloadSpec(trace=str(p), slo="none"))  # format detected
    assert [r.hash_ids for r in w.requests] == [(7, 8), None, (7,)]
    assert any("detected: mooncake" in n for n in w.notes)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ('{"timestamp": 0, "input_length": 5\n', r"line 1: not valid JSON"),
        (lines([1, 2]), r"line 1: expected a JSON object"),
        (lines({"timestamp": 0, "output_length": 3}), r"line 1: missing field\(s\) input_length"),
        (
            lines({"timestamp": 0, "input_length": 0, "output_length": 3}),
            r"line 1, field input_length: must be an integer >= 1",
        ),
        (
            lines({"timestamp": -1, "input_length": 2, "output_length": 3}),
            r"line 1, field timestamp: must be a number of ms >= 0",
        ),
        (
            lines(
                {"timestamp": 5, "input_length": 2, "output_length": 3},
                {"timestamp": 4, "input_length": 2, "output_length": 3},
            ),
            r"line 2, column timestamp: timestamps not sorted",
        ),
        (
            lines({"timestamp": 0, "input_length": 513, "output_length": 3, "hash_ids": [1, 2, 3]}),
            r"line 1, field hash_ids: 3 blocks, but input_length 513 fills at most 2 blocks",
        ),
        (
            lines({"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": ["a"]}),
            r'line 1, field hash_ids: must be a list of integers \(holds "a"\)',
        ),
        (
            lines({"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": 7}),
            r"line 1, field hash_ids: must be a list of integers \(not 7\)",
        ),
        (
            lines({"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": [1, True]}),
            r"line 1, field hash_ids: must be a list of integers \(holds true\)",
        ),
        (  # Python hashes -1 and -2 alike: they would share a cache key
            lines({"timestamp": 0, "input_length": 1024, "output_length": 3, "hash_ids": [0, -2]}),
            r"line 1, field hash_ids: -2 is negative",
        ),
    ],
)
def test_mooncake_errors_name_the_line(tmp_path: Path, body: str, match: str) -> None:
    p = write(tmp_path / "bad.jsonl", body)
    with pytest.raises(WorkloadError, match=match) as e:
        load_trace(p, "mooncake")
    assert "\n" not in str(e.value)


def test_mooncake_unsorted_sorted_with_a_note_when_not_strict(tmp_path: Path) -> None:
    p = write(
        tmp_path / "u.jsonl",
        lines(
            {"timestamp": 2000, "input_length": 2, "output_length": 3},
            {"timestamp": 1000, "input_length": 4, "output_length": 3},
        ),
    )
    t = load_trace(p, "mooncake", strict=False)
    assert t.df["arrival_s"].tolist() == [0.0, 1.0]
    assert t.df["prompt_tokens"].tolist() == [4, 2]
    assert any("sorted" in n for n in t.notes)


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared Mooncake trace not present")
def test_real_mooncake_trace_loads_and_replays() -> None:
    t = load_trace(MOONCAKE, "auto")
    assert len(t.df) == 12031  # the README's count
    assert t.df["hash_ids"].map(len).le((t.df["prompt_tokens"] + 511) // 512).all()
    spec = WorkloadSpec(
        trace=str(MOONCAKE), slo="none", replay=ReplayOptions(end_s=20.0, max_context=8192)
    )
    r = simulate(SimConfig(workload=spec, instance={"cost_model": "constant:0.01"}))
    assert r.summary["requests"] > 0
    assert any("mooncake" in n for n in r.summary["workload_notes"])


def test_detect_each_format(tmp_path: Path) -> None:
    cases = {
        "s.csv": ("arrival_s,prompt_tokens,output_tokens\n0,1,1\n", "sloserve"),
        "a.csv": ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "azure"),
        "b.csv": (
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n",
            "burstgpt",
        ),
        "m.jsonl": (lines({"timestamp": 0, "input_length": 1, "output_length": 1}), "mooncake"),
        "g.json": ('[{"conversations": []}]', "sharegpt"),
        # a typo in one column still picks the format: its own error names the column
        "typo.csv": ("arrival_s,prompt_tokens,outptu_tokens\n0,1,1\n", "sloserve"),
    }
    for name, (text, fmt) in cases.items():
        assert detect_format(write(tmp_path / name, text)) == fmt, name
    with pytest.raises(WorkloadError, match=r"missing column.*output_tokens"):
        load_trace(tmp_path / "typo.csv", "auto")


def test_unknown_header_lists_the_formats_and_the_flag(tmp_path: Path) -> None:
    p = write(tmp_path / "x.csv", "when,in,out\n1,2,3\n")
    with pytest.raises(WorkloadError) as e:
        load_trace(p, "auto")
    msg = str(e.value)
    assert "\n" not in msg
    for word in ("sloserve", "azure", "burstgpt", "mooncake", "--trace-format", "when, in, out"):
        assert word in msg
    p2 = write(tmp_path / "y.jsonl", lines({"ts": 1}))
    with pytest.raises(WorkloadError, match=r"first line \(fields: ts\) matches no known"):
        load_trace(p2, "auto")


def test_cli_trace_detection_and_unknown_header(tmp_path: Path) -> None:
    m = write(
        tmp_path / "m.jsonl",
        lines(
            {"timestamp": 0, "input_length": 100, "output_length": 5},
            {"timestamp": 250, "input_length": 50, "output_length": 3},
        ),
    )
    bad = write(tmp_path / "bad.csv", "a,b\n1,2\n")
    fast = ("--slo", "none", "--cost-model", "constant:0.01", "--json")
    out = run_many(
        {
            "ok": cli_argv("simulate", "--trace", m, *fast),
            "bad": cli_argv("simulate", "--trace", bad, *fast),
        }
    )
    assert out["ok"].returncode == 0, out["ok"].stderr
    s = json.loads(out["ok"].stdout)
    assert s["requests"] == 2
    assert s["workload_notes"][0].startswith("trace format detected: mooncake")
    assert out["bad"].returncode == 2
    err = out["bad"].stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sloserve: error:")
    assert "--trace-format" in err[0] and "mooncake" in err[0]


def test_export_vllm_jsonl(tmp_path: Path) -> None:
    spec = WorkloadSpec(mix="lmsys", duration_s=5, seed=3)
    reqs = build_workload(spec).requests
    p = export_vllm_jsonl(reqs, tmp_path / "ds.jsonl")
    rows = [json.loads(line) for line in p.read_text().splitlines()]
    assert len(rows) == len(reqs) > 0
    for row, r in zip(rows, reqs, strict=True):
        # vLLM's CustomDataset reads "prompt" (text) and, with --custom-output-len -1,
        # "output_tokens" per line
        assert isinstance(row["prompt"], str)
        assert row["output_tokens"] == r.true_output_len
        assert len(row["prompt"].split()) == r.num_prompt_tokens == row["prompt_tokens"]
    out = run_many(
        {
            "exp": cli_argv(
                "workload",
                "export",
                "--format",
                "vllm-jsonl",
                "--out",
                tmp_path / "c.jsonl",
                "--workload",
                "lmsys",
                "--duration",
                "5",
                "--seed",
                "3",
            ),
            "bad": cli_argv("workload", "export", "--format", "xml", "--out", tmp_path / "x"),
        }
    )
    assert out["exp"].returncode == 0, out["exp"].stderr
    assert (tmp_path / "c.jsonl").read_text() == p.read_text()  # deterministic, same workload
    assert "--dataset-name custom" in out["exp"].stdout.replace("\n", " ")
    assert out["bad"].returncode == 2 and "vllm-jsonl" in out["bad"].stderr
    assert math.isfinite(len(rows))
