"""``--config`` YAML files for ``simulate`` and ``compare``: the file applies, command-line
flags override it (including ``--arrival`` over the YAML's arrival kind), policy lists
and parameters, and an empty file meaning the defaults."""

from __future__ import annotations

import json
from pathlib import Path

from cli_app_helpers import (
    FAST,
    SHORT,
    drop_wall,
    invoke_json,
)
from cli_helpers import write
from sloserve.workloads import GammaArrivals, WorkloadSpec, build_requests


# ----------------------------------------------------------------------------- --config
def gamma_yaml(tmp_path: Path) -> Path:
    return write(
        tmp_path / "run.yaml",
        "policy: sarathi\n"
        "workload:\n"
        "  mix: lmsys\n"
        "  arrival: {kind: gamma, rate: 3.0, cv: 2.5}\n"
        "  duration_s: 20\n"
        "instance:\n"
        "  max_running: 8\n"
        "  cost_model: constant:0.01\n",
    )


def gamma_count(rate: float, seed: int) -> int:
    spec = WorkloadSpec(
        mix="lmsys", arrival=GammaArrivals(rate=rate, cv=2.5), duration_s=20.0, seed=seed
    )
    return len(build_requests(spec))


def test_config_yaml_applies(tmp_path: Path) -> None:
    cfg = gamma_yaml(tmp_path)
    out_dir = tmp_path / "out"
    s = invoke_json("simulate", "--config", cfg, "--out", out_dir)
    assert s["policy"] == "sarathi"
    assert s["limits"]["max_running"] == 8
    assert s["requests"] == gamma_count(3.0, 0)
    written = json.loads((out_dir / "config.json").read_text())["config"]
    assert written["policy"] == "sarathi"
    assert written["workload"]["mix"] == "lmsys"
    assert written["workload"]["arrival"] == {"kind": "gamma", "rate": 3.0, "cv": 2.5}
    assert written["workload"]["duration_s"] == 20.0
    assert written["instance"]["max_running"] == 8
    assert written["instance"]["cost_model"] == "constant:0.01"


def test_config_flags_override_yaml(tmp_path: Path) -> None:
    cfg = gamma_yaml(tmp_path)
    base = invoke_json("simulate", "--config", cfg)
    seeded = invoke_json("simulate", "--config", cfg, "--seed", "5")
    assert seeded["seed"] == 5
    assert seeded["requests"] == gamma_count(3.0, 5)
    assert drop_wall(seeded) != drop_wall(base)
    faster = invoke_json("simulate", "--config", cfg, "--rate", "6")
    assert faster["requests"] == gamma_count(6.0, 0)  # still gamma with the YAML's cv
    assert faster["requests"] > base["requests"]
    other = invoke_json("simulate", "--config", cfg, "--policy", "vllm", "--max-running", "3")
    assert other["policy"] == "vllm"
    assert other["limits"]["max_running"] == 3


def test_config_for_compare(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "cmp.yaml",
        "policies: [vllm, sarathi-ef]\n"
        "workload: {arrival: {rate: 2}, duration_s: 15}\n"
        "instance: {cost_model: 'constant:0.01'}\n",
    )
    s = invoke_json("compare", "--config", cfg)
    assert list(s) == ["vllm", "sarathi-ef", "run"]
    # --policies overrides the YAML list; missing arrival kind means poisson
    s2 = invoke_json("compare", "--config", cfg, "--policies", "edf")
    assert list(s2) == ["edf", "run"]
    spec = WorkloadSpec.model_validate(
        {"arrival": {"kind": "poisson", "rate": 2}, "duration_s": 15}
    )
    assert s2["edf"]["requests"] == len(build_requests(spec))


def test_config_empty_file_means_defaults(tmp_path: Path) -> None:
    cfg = write(tmp_path / "empty.yaml", "")
    s = invoke_json("simulate", "--config", cfg, *SHORT, *FAST)
    assert s["policy"] == "vllm"


def test_config_policy_params(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "pp.yaml",
        "policy: sarathi\npolicy_params: {prefill_tokens: 128}\n"
        "workload: {duration_s: 10, arrival: {rate: 1}}\n",
    )
    s = invoke_json("simulate", "--config", cfg, *FAST)
    assert s["policy_params"]["prefill_tokens"] == 128


def test_arrival_kind_flag_overrides_yaml_kind(tmp_path: Path) -> None:
    s = invoke_json("simulate", "--config", gamma_yaml(tmp_path), "--arrival", "poisson")
    assert s["requests"] > 0
