"""Execute mode from the command line: simulate --executor torch, calibrate, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from cli_helpers import assert_user_error, run_main
from sloserve.costmodel.profile import load_profile


def test_simulate_executor_torch_reports_measured_vs_predicted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "simulate",
        "--executor",
        "torch",
        "--model-spec",
        "tiny",
        "--policy",
        "andes",
        "--num-requests",
        "6",
        "--max-context",
        "48",
        "--json",
    ]
    proc = run_main(monkeypatch, capsys, *args)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["finished"] == 6
    timing = s["execute"]["timing"]
    assert timing["all"]["iterations"] == s["iterations"]
    for kind in ("prefill", "decode"):
        assert timing[kind]["median_measured_s"] > 0
        assert timing[kind]["p90_rel_err"] >= timing[kind]["median_rel_err"] >= 0


def test_calibrate_writes_a_profile_simulate_loads(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "tiny-cpu.yaml"
    proc = run_main(
        monkeypatch,
        capsys,
        "calibrate",
        "--model-spec",
        "tiny",
        "--out",
        str(out),
        "--repeats",
        "1",
        "--warmup",
        "0",
    )
    assert proc.returncode == 0, proc.stderr
    prof = load_profile(str(out))
    assert prof.model.num_layers == 2
    assert out.with_suffix(".csv").is_file()
    proc = run_main(
        monkeypatch, capsys, "simulate", "--profile", str(out), "--num-requests", "5", "--json"
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--model", "/no/such/ckpt"], ["--model /no/such/ckpt", "no such checkpoint"]),
        (["--model-spec", "tiny", "--device", "cuda"], ["--device cuda", "CUDA"]),
        (["--model-spec", "tiny", "--device", "tpu"], ["--device", "'tpu'"]),
        (["--model-spec", "tiny", "--executor", "jax"], ["--executor", "'jax'"]),
        (["--model-spec", "no-such-model"], ["no-such-model"]),
    ],
)
def test_bad_execute_input_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needles: list[str],
) -> None:
    import torch

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    base = ["simulate", "--num-requests", "2"]
    if "--executor" not in args:
        base += ["--executor", "torch"]
    assert_user_error(run_main(monkeypatch, capsys, *base, *args), *needles)


def test_not_llama_and_too_big_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    proc = run_main(
        monkeypatch, capsys, "simulate", "--executor", "torch", "--model", str(tmp_path)
    )
    assert_user_error(proc, str(tmp_path), "'gpt2' is not a Llama-family model")
    big = {
        "model_type": "llama",
        "hidden_size": 65536,
        "num_hidden_layers": 512,
        "num_attention_heads": 512,
        "intermediate_size": 262144,
        "vocab_size": 32000,
    }
    (tmp_path / "config.json").write_text(json.dumps(big))
    proc = run_main(
        monkeypatch,
        capsys,
        "calibrate",
        "--model",
        str(tmp_path),
        "--out",
        str(tmp_path / "x.yaml"),
    )
    assert_user_error(proc, "weights need", "GiB")
