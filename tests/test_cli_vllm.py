"""vLLM's flag and YAML names (issue 20, item 1): each gives the same config, and summary,
as sloserve's own name; two names with different values are a one-line error."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from cli_helpers import assert_user_error, run_main, write
from sloserve.cli._app import _build_config
from sloserve.core.errors import ConfigError

_NONE: dict[str, Any] = {}


def cfg(flags: dict[str, Any], config: Path | None = None) -> Any:
    return _build_config({}, config, flags)[0]


@pytest.mark.parametrize(
    ("vllm", "native", "value"),
    [
        ("max_num_seqs", "max_running", 8),
        ("max_num_batched_tokens", "max_batch_tokens", 2048),
        ("gpu_memory_utilization", "kv_utilization", 0.8),
        ("long_prefill_token_threshold", "chunk_size", 256),
        ("request_rate", "rate", 3.5),
        ("num_prompts", "num_requests", 40),
    ],
)
def test_alias_flag_gives_the_native_config(vllm: str, native: str, value: Any) -> None:
    assert cfg({vllm: value}) == cfg({native: value})
    assert cfg({vllm: value, native: value}) == cfg({native: value})  # same value: fine
    assert cfg({vllm: value}) != cfg({})
    with pytest.raises(ConfigError, match="contradicts"):
        cfg({vllm: value, native: value * 2})


def test_num_gpu_blocks_is_blocks_times_block_size() -> None:
    assert cfg({"num_gpu_blocks_override": 100}).instance.kv_capacity_tokens == 1600
    c = cfg({"num_gpu_blocks_override": 100, "block_size": 32})
    assert c.instance.kv_capacity_tokens == 3200
    assert cfg({"num_gpu_blocks_override": 100, "kv_capacity": 1600}) == cfg({"kv_capacity": 1600})
    with pytest.raises(ConfigError, match="contradicts kv_capacity_tokens"):
        cfg({"num_gpu_blocks_override": 100, "kv_capacity": 1000})


def test_burstiness_is_gamma_with_cv_one_over_sqrt() -> None:
    a = cfg({"burstiness": 4.0}).workload.arrival
    assert a.kind == "gamma" and math.isclose(a.cv, 0.5)
    assert cfg({"burstiness": 4.0}) == cfg({"arrival": "gamma", "cv": 0.5})
    assert cfg({"burstiness": 1.0, "arrival": "poisson"}).workload.arrival.kind == "poisson"
    with pytest.raises(ConfigError, match="cv = 1/sqrt"):
        cfg({"burstiness": 4.0, "cv": 2.0})
    with pytest.raises(ConfigError, match="needs gamma"):
        cfg({"burstiness": 4.0, "arrival": "bursty"})


def test_tensor_parallel_size_picks_the_profile_tp() -> None:
    assert cfg({"profile": "llama-3-8b@h100", "tensor_parallel_size": 2}).instance.profile == (
        "llama-3-8b@h100x2"
    )
    same = cfg({"profile": "llama-3-8b@h100x2", "tensor_parallel_size": 2})
    assert same.instance.profile == "llama-3-8b@h100x2"
    with pytest.raises(ConfigError, match="contradicts profile"):
        cfg({"profile": "llama-3-8b@h100x4", "tensor_parallel_size": 2})
    with pytest.raises(ConfigError, match="contradicts profile 'llama-2-7b-a100'"):
        cfg({"profile": "llama-2-7b-a100", "tensor_parallel_size": 2})
    # no profile: the default profile's model and GPU at that TP
    assert cfg({"tensor_parallel_size": 1}) == cfg({})
    assert cfg({"tensor_parallel_size": 2}).instance.profile.endswith("x2")


def test_chunked_prefill_off_means_whole_prefills() -> None:
    c = cfg({"enable_chunked_prefill": False, "max_batch_tokens": 2048})
    assert c.instance.chunk_size == 2048
    assert cfg({"enable_chunked_prefill": True}) == cfg({})
    with pytest.raises(ConfigError, match="enable_chunked_prefill is off"):
        cfg({"enable_chunked_prefill": False, "long_prefill_token_threshold": 128})


def test_yaml_engine_section_and_instance_level_aliases(tmp_path: Path) -> None:
    native = write(
        tmp_path / "native.yaml",
        "instance: {max_running: 8, max_batch_tokens: 2048, kv_capacity_tokens: 3200, "
        "block_size: 32}\nworkload: {num_requests: 30, arrival: {rate: 2.0}}\n",
    )
    engine = write(
        tmp_path / "engine.yaml",
        "engine: {max-num-seqs: 8, max_num_batched_tokens: 2048, num_gpu_blocks_override: 100,"
        " block-size: 32}\nworkload: {num_prompts: 30, request_rate: 2.0}\n",
    )
    inline = write(
        tmp_path / "inline.yaml",
        "instance: {max_num_seqs: 8, max_num_batched_tokens: 2048, block_size: 32, "
        "num_gpu_blocks_override: 100}\nworkload: {num_requests: 30, request_rate: 2.0}\n",
    )
    assert cfg(_NONE, engine) == cfg(_NONE, native) == cfg(_NONE, inline)
    # a flag overrides the file, across names too
    assert cfg({"max_running": 4}, engine).instance.max_running == 4
    assert cfg({"kv_capacity": 999}, engine).instance.kv_capacity_tokens == 999
    bad = write(tmp_path / "bad.yaml", "instance: {max_running: 8, max_num_seqs: 9}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: instance: max_num_seqs \(9\) contradicts"):
        cfg(_NONE, bad)
    bad2 = write(tmp_path / "bad2.yaml", "instance: {max_running: 8}\nengine: {max_num_seqs: 9}\n")
    with pytest.raises(ConfigError, match=r"engine\.max_num_seqs"):
        cfg(_NONE, bad2)


def test_simulate_with_vllm_flags_matches_native(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ("simulate", "--workload", "sharegpt", "--json", "--seed", "3")
    vllm = run_main(
        monkeypatch, capsys, *common, "--num-prompts", "25", "--request-rate", "3",
        "--max-num-seqs", "8", "--max-num-batched-tokens", "2048",
        "--gpu-memory-utilization", "0.8", "--burstiness", "4",
    )  # fmt: skip
    native = run_main(
        monkeypatch, capsys, *common, "--num-requests", "25", "--rate", "3",
        "--max-running", "8", "--max-batch-tokens", "2048", "--kv-utilization", "0.8",
        "--arrival", "gamma", "--cv", "0.5",
    )  # fmt: skip
    assert vllm.returncode == native.returncode == 0, vllm.stderr
    drop = ("wall_seconds",)
    a, b = json.loads(vllm.stdout), json.loads(native.stdout)
    for d in (a, b):
        for k in drop:
            d.pop(k, None)
    assert a == b


def test_contradictory_flags_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = run_main(
        monkeypatch, capsys, "simulate", "--max-num-seqs", "8", "--max-running", "9",
        "--num-requests", "5",
    )  # fmt: skip
    assert_user_error(proc, "--max-num-seqs 8 contradicts --max-running 9")


def test_help_shows_each_vllm_name_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    for command in ("simulate", "compare", "serve"):
        out = run_main(monkeypatch, capsys, command, "--help").stdout
        for name in (
            "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization",
            "--num-gpu-blocks-override", "--tensor-parallel-size", "--long-prefill-token-threshold",
        ):  # fmt: skip
            assert out.count(name) == 1, (command, name)
        if command != "serve":
            for name in ("--request-rate", "--num-prompts", "--burstiness"):
                assert out.count(name) == 1, (command, name)
