"""``sloserve capacity``: a small plan end to end, both questions, and the one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cli_helpers import assert_user_error, run_main

WORKLOAD = {"arrival": {"kind": "poisson", "rate": 3}, "duration_s": 20, "mix": "sharegpt"}


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    p = tmp_path / "wl.yaml"
    p.write_text(yaml.safe_dump(WORKLOAD))
    return p


def test_a_small_plan_end_to_end(
    tmp_path: Path,
    workload: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "cap"
    proc = run_main(
        monkeypatch,
        capsys,
        "capacity",
        "--workload",
        str(workload),
        "--slo",
        "ttft_p90=1s,tpot_p90=80ms",
        "--attainment",
        "0.9",
        "--profiles",
        "llama-2-7b-a40",
        "--routers",
        "least-loaded",
        "--policies",
        "vllm,sarathi",
        "--rates",
        "3:9:6",
        "--seeds",
        "1",
        "--workers",
        "1",
        "--out",
        str(out),
        "--json",
        "--gpu-price",
        "llama-2-7b-a40=0.8",
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    answers = info["answers"]
    assert [(a["policy"], a["rate"]) for a in answers] == [
        ("vllm", 3.0),
        ("sarathi", 3.0),
        ("vllm", 9.0),
        ("sarathi", 9.0),
    ]
    for a in answers:
        assert a["replicas"] >= 1 and a["attainment"] >= 0.9
        assert a["usd_per_hour"] == pytest.approx(0.8 * a["gpus"])
    nine = [a["replicas"] for a in answers if a["rate"] == 9.0]
    three = [a["replicas"] for a in answers if a["rate"] == 3.0]
    assert min(nine) >= max(three) >= 1
    assert info["plan"]["commands"][0].startswith("vllm serve meta-llama/Llama-2-7b-hf")
    assert (out / "deploy" / "values.yaml").is_file() and (out / "gpus_vs_rate.png").is_file()


def test_max_rate_of_a_fixed_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "workload": {**WORKLOAD, "duration_s": 15},
                "instance": {"profile": "llama-2-7b-a100"},
                "cluster": {"replicas": [{"count": 1}], "router": "least-loaded"},
            }
        )
    )
    proc = run_main(
        monkeypatch,
        capsys,
        "capacity",
        "--config",
        str(cfg),
        "--max-rate",
        "--slo",
        "ttft_p90=1s",
        "--attainment",
        "0.9",
        "--seeds",
        "1",
        "--workers",
        "1",
        "--tolerance",
        "0.25",
        "--out",
        str(tmp_path / "o"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "Highest sustained rate" in proc.stdout and "plan: least-loaded + vllm" in proc.stdout
    ans = json.loads((tmp_path / "o" / "capacity.json").read_text())
    assert ans["question"] == "max-rate" and ans["monotone"]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--attainment", "1.5"], ["--attainment", "must be ≤ 1 (got 1.5)"]),
        (["--attainment", "0"], ["--attainment", "must be > 0 (got 0.0)"]),
        (["--rates", "20:2"], ["--rates: '20:2': max 2 < min 20"]),
        (["--routers", ","], ["--routers: the search space is empty"]),
        (["--policies", "vlm"], ["--policies:", "unknown policy 'vlm'"]),
        (
            ["--slo", "ttft=1ms", "--profiles", "llama-2-70b-a100x2"],
            ["ttft=0.001s cannot be met on llama-2-70b-a100x2", "ms over"],
        ),
        (["--slo", "ttft_p90"], ["--slo: 'ttft_p90' is not METRIC[_pNN]=VALUE"]),
        (["--max-rate"], ["--max-rate: give the fixed cluster with --config"]),
        (["--screen", "1"], ["--screen: 1 outside (0, 1)"]),
        (["--screen", "-0.5"], ["--screen"]),
        (["--gpu-price", "x"], ["--gpu-price: 'x' is not PROFILE=USD"]),
        (["--layouts", "pd:1"], ["--layouts: 'pd:1' is not 'agg' or 'pd:P:D'"]),
        (["--router-params", "x"], ["--router-params: 'x' is not ROUTER.KEY=VALUE"]),
        (
            ["--router-params", "least-loaded.foo=1"],
            ["--router-params: router 'least-loaded': unknown parameter"],
        ),
        (
            ["--router-params", "aladdin.gamma=1"],
            ["--router-params: 'aladdin' is not one of the searched routers"],
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str],
    needles: list[str],
    workload: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proc = run_main(
        monkeypatch,
        capsys,
        "capacity",
        "--workload",
        str(workload),
        "--slo",
        "ttft=2s",
        "--out",
        str(tmp_path / "o"),
        *args,
    )
    assert_user_error(proc, *needles)


def test_the_traffic_is_required(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = run_main(monkeypatch, capsys, "capacity", "--slo", "ttft=2s")
    assert_user_error(proc, "--workload FILE or --config FILE")
