"""The ``sloserve`` command line: output (typer's CliRunner, in process) and the real
exit-status / one-line-error contract of the console entry point (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner, Result

from cli_helpers import assert_user_error, cli_argv, run_main, run_many, write
from sloserve import cli
from sloserve.cli import app
from sloserve.config import builtin_config
from sloserve.core.errors import SloserveError
from sloserve.workloads import GammaArrivals, WorkloadSpec, build_requests

FAST = ["--cost-model", "constant:0.01"]
SHORT = ["--rate", "2", "--duration", "30"]

SUMMARY_KEYS = {
    "requests",
    "finished",
    "ttft_mean",
    "ttft_p50",
    "ttft_p99",
    "tpot_mean",
    "tpot_p50",
    "tpot_p99",
    "qoe_mean",
    "e2e_mean",
    "e2e_p50",
    "e2e_p99",
    "normalized_latency_mean",
    "slo_attainment",
    "throughput_tokens_per_s",
    "throughput_requests_per_s",
    "preemptions",
    "simulated_seconds",
    "wall_seconds",
    "policy",
}

ALL_POLICIES = [
    "vllm",
    "sarathi",
    "sarathi-p=c",
    "sarathi-nocp",
    "vllm-hy",
    "sarathi-nohy",
    "vllm-ef",
    "sarathi-ef",
    "sarathi-p=c-ef",
    "sarathi-nocp-ef",
    "vllm-hy-ef",
    "sarathi-nohy-ef",
    "edf",
    "rank-input",
    "rank-output",
]

REPORT_FILES = [
    "requests.parquet",
    "trace.parquet",
    "summary.json",
    "config.json",
    "cdf_ttft.png",
    "cdf_tpot.png",
    "cdf_qoe.png",
    "timeline.png",
]


# ----------------------------------------------------------------------------- helpers
@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A console wide enough that rich does not ellipsize table cells."""
    monkeypatch.setattr(cli.console, "_width", 250)


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ordinary 80-column terminal (also what a pipe gets by default)."""
    monkeypatch.setattr(cli.console, "_width", 80)


def invoke(*args: str | Path) -> Result:
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exit_code != 0:
        raise AssertionError(
            f"exit {result.exit_code}: {result.output}\n{result.exception!r}"
        ) from result.exception
    return result


def invoke_json(*args: str | Path) -> Any:
    out = invoke(*args, "--json").stdout

    def no_nan(c: str) -> None:
        raise AssertionError(f"not strict JSON: {c}")

    return json.loads(out, parse_constant=no_nan)




def drop_wall(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "wall_seconds"}


# ----------------------------------------------------------------------------- simulate
def test_simulate_json_summary() -> None:
    args = ["simulate", "--policy", "vllm", "--workload", "sharegpt", "--rate", "4"]
    s = invoke_json(*args, "--duration", "30")
    assert set(s) >= SUMMARY_KEYS
    assert s["policy"] == "vllm"
    assert s["requests"] > 60
    assert s["finished"] == s["requests"]
    assert s["rejected"] == 0 and s["aborted"] == 0
    assert 0 < s["ttft_p50"] <= s["ttft_p99"]
    assert 0 < s["tpot_p50"] <= s["tpot_p99"]
    assert 0 < s["e2e_p50"] <= s["e2e_p99"]
    assert 0 <= s["slo_attainment"] <= 1
    assert 0 <= s["qoe_mean"] <= 1
    assert s["simulated_seconds"] >= 25
    assert s["throughput_requests_per_s"] == pytest.approx(s["finished"] / s["simulated_seconds"])
    assert isinstance(s["preemptions"], int)
    assert s["profile"] == "llama-2-7b-a100"
    assert s["seed"] == 0


def test_simulate_json_is_deterministic() -> None:
    args = ["simulate", "--policy", "vllm", "--workload", "sharegpt", "--rate", "4"]
    a = invoke_json(*args, "--duration", "30")
    b = invoke_json(*args, "--duration", "30")
    assert drop_wall(a) == drop_wall(b)
    assert a["wall_seconds"] >= 0


def test_simulate_request_count_matches_workload() -> None:
    s = invoke_json("simulate", *SHORT, *FAST, "--seed", "3")
    expected = build_requests(
        WorkloadSpec.model_validate(
            {"arrival": {"kind": "poisson", "rate": 2.0}, "duration_s": 30.0, "seed": 3}
        )
    )
    assert s["requests"] == len(expected)


def test_simulate_flags_reach_the_config() -> None:
    s = invoke_json(
        "simulate",
        *SHORT,
        *FAST,
        "--policy",
        "sarathi",
        "--max-running",
        "7",
        "--max-batch-tokens",
        "2048",
        "--chunk-size",
        "256",
        "--block-size",
        "8",
        "--kv-capacity",
        "50000",
        "--predictor",
        "constant:100",
        "--seed",
        "4",
    )
    assert s["policy"] == "sarathi"
    assert s["limits"] == {
        "max_batch_tokens": 2048,
        "max_prefill_tokens": 256,
        "kv_capacity_tokens": 50000,
        "max_running": 7,
        "block_size": 8,
    }
    assert s["predictor"] == "constant:100"
    assert s["seed"] == 4


def test_simulate_kv_utilization_changes_capacity() -> None:
    lo = invoke_json("simulate", *SHORT, *FAST, "--kv-utilization", "0.5")
    hi = invoke_json("simulate", *SHORT, *FAST, "--kv-utilization", "0.9")
    assert 0 < lo["kv_capacity_tokens"] < hi["kv_capacity_tokens"]


def test_simulate_horizon_aborts() -> None:
    s = invoke_json("simulate", "--rate", "20", "--duration", "30", "--horizon", "5")
    assert s["aborted"] > 0
    assert s["finished"] > 0
    assert s["simulated_seconds"] <= 5 + 1e-9


def test_simulate_horizon_accounts_for_every_request() -> None:
    """Requests arriving after the horizon never reach the replica and are left out."""
    s = invoke_json("simulate", "--rate", "20", "--duration", "30", "--horizon", "5")
    assert s["finished"] + s["aborted"] + s["rejected"] == s["requests"]


def test_simulate_num_requests_caps() -> None:
    s = invoke_json("simulate", *SHORT, *FAST, "--num-requests", "9")
    assert s["requests"] == 9


@pytest.mark.parametrize("arrival", ["poisson", "gamma", "constant", "bursty"])
def test_simulate_arrival_kinds(arrival: str) -> None:
    extra = ["--burst-period", "10"] if arrival == "bursty" else []
    s = invoke_json("simulate", "--arrival", arrival, *SHORT, *FAST, *extra)
    assert s["finished"] == s["requests"] > 0
    if arrival == "constant":
        assert s["requests"] == 60


def test_simulate_table_output(wide: None) -> None:
    out = invoke("simulate", "--policy", "sarathi-nocp-ef", *SHORT, *FAST).stdout
    assert "sarathi-nocp-ef" in out
    assert "requests" in out and "simulated" in out
    for header in ("TTFT p50 s", "TPOT p99 ms", "SLO att.", "QoE"):
        assert header in out


def test_simulate_out_writes_report(tmp_path: Path, wide: None) -> None:
    out_dir = tmp_path / "nested" / "run"
    res = invoke("simulate", *SHORT, *FAST, "--out", out_dir)
    assert "report written to" in res.stdout
    for f in REPORT_FILES:
        assert (out_dir / f).stat().st_size > 0, f
    summary = json.loads((out_dir / "summary.json").read_text())
    assert list(summary) == ["vllm"]


def test_simulate_trace_replay(tmp_path: Path) -> None:
    trace = write(
        tmp_path / "t.csv",
        "arrival_s,prompt_tokens,output_tokens,class\n"
        "0,100,10,rt\n0.5,2000,20,be\n1.0,50,5,rt\n3.0,10,1,rt\n",
    )
    out_dir = tmp_path / "r"
    s = invoke_json("simulate", "--trace", trace, *FAST, "--out", out_dir)
    assert s["requests"] == s["finished"] == 4
    df = pd.read_parquet(out_dir / "requests.parquet").sort_values("req_id")
    assert df["arrival_s"].tolist() == [0.0, 0.5, 1.0, 3.0]
    assert df["prompt_tokens"].tolist() == [100, 2000, 50, 10]
    assert df["output_tokens"].tolist() == [10, 20, 5, 1]
    assert df["generated_tokens"].tolist() == [10, 20, 5, 1]
    assert df["class"].tolist() == ["rt", "be", "rt", "rt"]


# ----------------------------------------------------------------------------- compare
@pytest.fixture(scope="module")
def compare_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out_dir = tmp_path_factory.mktemp("cmp") / "report"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli.console, "_width", 250)
        res = invoke(
            "compare", "--policies", "vllm,sarathi", *SHORT, "--seed", "1", "--out", out_dir
        )
    return out_dir, res.stdout


def test_compare_writes_report_files(compare_run: tuple[Path, str]) -> None:
    out_dir, _ = compare_run
    for f in REPORT_FILES:
        p = out_dir / f
        assert p.is_file() and p.stat().st_size > 0, f
    for f in ("cdf_ttft.png", "cdf_tpot.png", "cdf_qoe.png", "timeline.png"):
        assert (out_dir / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_requests_parquet(compare_run: tuple[Path, str]) -> None:
    out_dir, _ = compare_run
    df = pd.read_parquet(out_dir / "requests.parquet")
    assert "policy" in df.columns
    assert set(df["policy"]) == {"vllm", "sarathi"}
    summary = json.loads((out_dir / "summary.json").read_text())
    n = summary["vllm"]["requests"]
    assert n > 20
    assert summary["sarathi"]["requests"] == n
    assert len(df) == 2 * n
    by = {p: g.sort_values("req_id") for p, g in df.groupby("policy")}
    for g in by.values():
        assert g["req_id"].tolist() == list(range(n))
    # the very same requests for both policies
    for col in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert by["vllm"][col].tolist() == by["sarathi"][col].tolist()


def test_compare_trace_parquet(compare_run: tuple[Path, str]) -> None:
    out_dir, _ = compare_run
    tr = pd.read_parquet(out_dir / "trace.parquet")
    assert {"policy", "time", "running", "waiting", "kv_usage"} <= set(tr.columns)
    assert set(tr["policy"]) == {"vllm", "sarathi"}
    assert tr["kv_usage"].between(0, 1).all()


def test_compare_summary_and_config_json(compare_run: tuple[Path, str]) -> None:
    out_dir, _ = compare_run
    summary = json.loads((out_dir / "summary.json").read_text())
    assert set(summary) == {"vllm", "sarathi"}
    for name, s in summary.items():
        assert set(s) >= SUMMARY_KEYS
        assert s["policy"] == name
        assert s["seed"] == 1
    config = json.loads((out_dir / "config.json").read_text())
    assert config["policies"] == ["vllm", "sarathi"]
    assert config["config"]["workload"]["arrival"] == {"kind": "poisson", "rate": 2.0}
    assert config["config"]["workload"]["duration_s"] == 30.0
    assert config["config"]["workload"]["seed"] == 1


def test_compare_prints_table(compare_run: tuple[Path, str]) -> None:
    _, out = compare_run
    assert "vllm" in out and "sarathi" in out
    assert "same arrivals for every policy" in out
    assert "report written to" in out


def test_compare_json() -> None:
    s = invoke_json("compare", "--policies", "vllm, edf ,rank-input", *SHORT, *FAST)
    assert list(s) == ["vllm", "edf", "rank-input", "run"]  # what ran, beside the summaries
    assert s.pop("run")["policy"] == ["vllm", "edf", "rank-input"]
    counts = {v["requests"] for v in s.values()}
    assert len(counts) == 1
    for name, v in s.items():
        assert v["policy"] == name
        assert v["finished"] == v["requests"]


def test_compare_matches_simulate() -> None:
    c = invoke_json("compare", "--policies", "vllm,sarathi", *SHORT, *FAST)
    s = invoke_json("simulate", "--policy", "sarathi", *SHORT, *FAST)
    assert s.pop("run")["policy"] == "sarathi"
    assert drop_wall(c["sarathi"]) == drop_wall(s)


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


# ----------------------------------------------------------------------------- errors
@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    existing = d / "a_file"
    existing.write_text("x")
    (d / "latin1.yaml").write_bytes(b"policy: vllm\n# caf\xe9\n")
    return {
        "dir": d,
        "unknown_key": write(d / "unknown_key.yaml", "policy: vllm\nworkload:\n  bogus_key: 3\n"),
        "unknown_top": write(d / "unknown_top.yaml", "polcy: vllm\n"),
        "malformed": write(d / "malformed.yaml", "policy: [vllm\nworkload: {\n"),
        "list": write(d / "list.yaml", "- vllm\n- sarathi\n"),
        "policies_str": write(d / "policies_str.yaml", "policies: vllm\n"),
        "trace_missing": write(d / "missing_col.csv", "arrival_s,prompt_tokens\n0,10\n"),
        "trace_bad": write(
            d / "bad_value.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,many\n"
        ),
        "existing": existing,
        "latin1": d / "latin1.yaml",
        "bad_profile": write(d / "bad_profile.yaml", "name: [x\nmodel: {\n"),
        "thin_profile": write(d / "thin_profile.yaml", "name: x\n"),
    }


ERROR_CASES: list[tuple[str, list[str], list[str]]] = [
    (
        "unknown-policy",
        ["simulate", "--policy", "fifo-magic", "--duration", "5"],
        ["fifo-magic", "vllm", "sarathi", "rank-output"],
    ),
    (
        "huge-kv-capacity",
        ["simulate", "--kv-capacity", "1000000000000", "--duration", "5"],
        ["kv_capacity_tokens", "50000000", "1000000000000"],
    ),
    (
        "unknown-policy-in-compare",
        ["compare", "--policies", "vllm,fifo-magic", "--duration", "5"],
        ["fifo-magic", "valid:", "vllm"],
    ),
    ("duplicate-policy", ["compare", "--policies", "vllm,vllm", "--duration", "5"], ["vllm"]),
    ("no-policies", ["compare", "--duration", "5"], ["--policies"]),
    ("negative-rate", ["simulate", "--rate", "-1", "--duration", "5"], ["rate", "-1"]),
    ("zero-duration", ["simulate", "--duration", "0"], ["duration_s"]),
    ("zero-num-requests", ["simulate", "--num-requests", "0"], ["num_requests"]),
    ("unknown-key", ["simulate", "--config", "{unknown_key}"], ["bogus_key", "unknown key"]),
    ("unknown-top-key", ["simulate", "--config", "{unknown_top}"], ["polcy", "unknown key"]),
    ("missing-config", ["simulate", "--config", "{dir}/nope.yaml"], ["nope.yaml", "not found"]),
    ("malformed-yaml", ["simulate", "--config", "{malformed}"], ["malformed.yaml", "YAML"]),
    ("yaml-not-mapping", ["simulate", "--config", "{list}"], ["list.yaml", "mapping"]),
    ("policies-not-list", ["compare", "--config", "{policies_str}"], ["policies", "list"]),
    (
        "unknown-workload",
        ["simulate", "--workload", "alpaca", "--duration", "5"],
        ["alpaca", "sharegpt", "lmsys", "be-synthetic"],
    ),
    (
        "unknown-profile",
        ["simulate", "--profile", "gpt-9-h100", "--duration", "5"],
        ["gpt-9-h100", "llama-2-7b-a100"],
    ),
    (
        "missing-profile-yaml",
        ["simulate", "--profile", "{dir}/nope-profile.yaml", "--duration", "5"],
        ["nope-profile.yaml"],
    ),
    (
        "incomplete-profile-yaml",
        ["simulate", "--profile", "{thin_profile}", "--duration", "5"],
        ["thin_profile.yaml", "model"],
    ),
    (
        "trace-missing-column",
        ["simulate", "--trace", "{trace_missing}"],
        ["missing_col.csv", "output_tokens"],
    ),
    (
        "trace-bad-value",
        ["simulate", "--trace", "{trace_bad}"],
        ["bad_value.csv", "line 3", "output_tokens", "many"],
    ),
    ("trace-not-found", ["simulate", "--trace", "{dir}/none.csv"], ["none.csv", "not found"]),
    (
        "infeasible-bursty",
        [
            "simulate",
            "--arrival",
            "bursty",
            "--rate",
            "2",
            "--burst-intensity",
            "3",
            "--burst-fraction",
            "0.5",
            "--duration",
            "5",
        ],
        ["intensity", "burst_fraction"],
    ),
    ("unknown-arrival", ["simulate", "--arrival", "weibull", "--rate", "1"], ["weibull"]),
    ("bad-cost-model", ["simulate", "--cost-model", "quadratic", "--duration", "5"], ["cost"]),
    ("kv-utilization", ["simulate", "--kv-utilization", "1.5"], ["kv_utilization", "1.5"]),
    ("bad-predictor", ["simulate", "--predictor", "psychic", "--duration", "5"], ["psychic"]),
    (
        "out-is-a-file",
        ["simulate", "--duration", "5", "--rate", "1", *FAST, "--out", "{existing}"],
        ["a_file"],
    ),
    (
        "demo-unknown-policy",
        ["demo", "--policies", "fifo-magic", "--duration", "5", "--out", "{dir}/d"],
        ["fifo-magic"],
    ),
]


# The cases the real entry point runs in a subprocess (the rest run main() in process).
ENTRY_POINT_CASES = {
    "unknown-policy",
    "negative-rate",
    "unknown-key",
    "missing-config",
    "unknown-workload",
    "unknown-profile",
    "trace-missing-column",
    "malformed-yaml",
    "infeasible-bursty",
}


@pytest.fixture(scope="module")
def entry(files: dict[str, Path]) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every subprocess run of this module, started together."""
    argvs = {
        name: cli_argv(*[a.format(**files) for a in args])
        for name, args, _ in ERROR_CASES
        if name in ENTRY_POINT_CASES
    }
    argvs.update(
        {
            "help": cli_argv("--help"),
            "simulate-help": cli_argv("simulate", "--help"),
            "usage-error": cli_argv("simulate", "--rate", "fast"),
            "latin1-config": cli_argv("simulate", "--config", files["latin1"]),
            "bad-profile": cli_argv("simulate", "--profile", files["bad_profile"]),
            "profiles": cli_argv("profiles"),
            "arrival-no-rate": cli_argv(
                "simulate", "--arrival", "gamma", "--duration", "5", *FAST, "--json"
            ),
        }
    )
    script = Path(sys.executable).parent / "sloserve"
    if script.exists():
        argvs["console-script"] = [str(script), "policies", "--help"]
    return run_many(argvs)


@pytest.mark.parametrize(("name", "args", "needles"), ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_user_errors_are_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    files: dict[str, Path],
    name: str,
    args: list[str],
    needles: list[str],
) -> None:
    argv = [a.format(**files) for a in args]
    assert_user_error(run_main(monkeypatch, capsys, *argv), *needles)


@pytest.mark.parametrize(
    ("name", "needles"),
    [(c[0], c[2]) for c in ERROR_CASES if c[0] in ENTRY_POINT_CASES],
    ids=[c[0] for c in ERROR_CASES if c[0] in ENTRY_POINT_CASES],
)
def test_entry_point_errors_are_one_line_exit_2(
    entry: dict[str, subprocess.CompletedProcess[str]], name: str, needles: list[str]
) -> None:
    assert_user_error(entry[name], *needles)


def test_user_errors_raise_sloserve_error_in_process(files: dict[str, Path]) -> None:
    """Inside the app the errors are typed; only main() turns them into exit status 2."""
    res = CliRunner().invoke(app, ["simulate", "--config", str(files["unknown_key"])])
    assert isinstance(res.exception, SloserveError)
    assert "bogus_key" in str(res.exception)


def test_typer_usage_error_exit_2(entry: dict[str, subprocess.CompletedProcess[str]]) -> None:
    proc = entry["usage-error"]
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "--rate" in proc.stderr


def test_non_utf8_config_is_one_line_error(
    entry: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    assert_user_error(entry["latin1-config"], "latin1.yaml")


def test_malformed_profile_yaml_is_one_line_error(
    entry: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    assert_user_error(entry["bad-profile"], "bad_profile.yaml")


def test_arrival_kind_flag_alone_keeps_default_rate(
    entry: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    proc = entry["arrival-no-rate"]
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["requests"] > 0


def test_arrival_kind_flag_overrides_yaml_kind(tmp_path: Path) -> None:
    s = invoke_json("simulate", "--config", gamma_yaml(tmp_path), "--arrival", "poisson")
    assert s["requests"] > 0


# ----------------------------------------------------------------------------- help
@pytest.mark.parametrize(
    ("cmd", "options"),
    [
        ([], ["simulate", "compare", "demo", "policies", "profiles"]),
        (
            ["simulate"],
            [
                "--config",
                "--policy",
                "--workload",
                "--trace",
                "--arrival",
                "--rate",
                "--cv",
                "--burst-intensity",
                "--duration",
                "--num-requests",
                "--seed",
                "--profile",
                "--max-running",
                "--max-batch-tokens",
                "--chunk-size",
                "--block-size",
                "--kv-utilization",
                "--kv-capacity",
                "--predictor",
                "--cost-model",
                "--horizon",
                "--out",
                "--json",
            ],
        ),
        (["compare"], ["--config", "--policies", "--rate", "--max-running", "--out", "--json"]),
        (["demo"], ["--out", "--config", "--policies", "--duration", "--rate", "--seed"]),
        (["policies"], ["--help"]),
        (["profiles"], ["--help"]),
    ],
    ids=["top", "simulate", "compare", "demo", "policies", "profiles"],
)
def test_help(cmd: list[str], options: list[str]) -> None:
    res = invoke(*cmd, "--help")
    assert "Usage" in res.stdout
    for opt in options:
        assert opt in res.stdout, opt


def test_help_entry_point_exit_0(entry: dict[str, subprocess.CompletedProcess[str]]) -> None:
    proc = entry["help"]
    assert proc.returncode == 0, proc.stderr
    assert "simulate" in proc.stdout and "profiles" in proc.stdout
    assert proc.stderr == ""
    proc = entry["simulate-help"]
    assert proc.returncode == 0, proc.stderr
    assert "--kv-utilization" in proc.stdout and "--chunk-size" in proc.stdout


def test_console_script_installed(entry: dict[str, subprocess.CompletedProcess[str]]) -> None:
    if "console-script" not in entry:
        pytest.skip("console script not installed next to the interpreter")
    proc = entry["console-script"]
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout


# ----------------------------------------------------------------------------- listings
def test_policies_lists_every_policy(wide: None) -> None:
    out = invoke("policies").stdout
    listed = {line.split("│")[1].strip() for line in out.splitlines() if line.count("│") >= 3}
    assert set(ALL_POLICIES) <= listed
    assert "Sarathi-Serve" in out and "eviction-free" in out


def test_profiles_lists_builtin_profiles(wide: None) -> None:
    out = invoke("profiles").stdout
    assert "llama-2-7b-a100" in out
    assert "llama-2-70b-a100x2" in out
    assert "A100" in out


def test_profiles_entry_point(entry: dict[str, subprocess.CompletedProcess[str]]) -> None:
    proc = entry["profiles"]  # COLUMNS=200
    assert proc.returncode == 0, proc.stderr
    assert "llama-2-7b-a100" in proc.stdout
    assert "llama-2-70b-a100x2" in proc.stdout


def test_profiles_names_readable_at_80_columns(narrow: None) -> None:
    out = invoke("profiles").stdout
    assert "llama-2-7b-a100" in out
    assert "llama-2-70b-a100x2" in out


def test_compare_table_names_policies_at_80_columns(narrow: None) -> None:
    out = invoke("compare", "--policies", "vllm,sarathi-nocp-ef", *SHORT, *FAST).stdout
    assert "sarathi-nocp-ef" in out
    assert "…" not in out


# ----------------------------------------------------------------------------- demo
def test_demo_writes_report(tmp_path: Path, wide: None) -> None:
    out_dir = tmp_path / "demo"
    res = invoke("demo", "--duration", "20", "--out", out_dir)
    assert "report written to" in res.stdout
    for f in REPORT_FILES:
        assert (out_dir / f).stat().st_size > 0, f
    summary = json.loads((out_dir / "summary.json").read_text())
    builtin = builtin_config("demo")
    expected = builtin["policies"]
    assert list(summary) == expected
    for name in expected:
        assert name in res.stdout
    config = json.loads((out_dir / "config.json").read_text())["config"]
    assert config["workload"]["arrival"] == {
        **builtin["workload"]["arrival"],
        "rate": float(builtin["workload"]["arrival"]["rate"]),
    }
    assert config["workload"]["duration_s"] == 20.0
    df = pd.read_parquet(out_dir / "requests.parquet")
    assert len(df) == len(expected) * summary["vllm"]["requests"]


def test_demo_flags_override_builtin(tmp_path: Path, wide: None) -> None:
    out_dir = tmp_path / "demo"
    invoke(
        "demo", "--duration", "10", "--rate", "3", "--seed", "2",
        "--policies", "vllm,sarathi", "--out", out_dir,
    )  # fmt: skip
    config = json.loads((out_dir / "config.json").read_text())
    assert config["policies"] == ["vllm", "sarathi"]
    arrival = config["config"]["workload"]["arrival"]
    assert arrival["kind"] == "bursty" and arrival["rate"] == 3.0
    assert config["config"]["workload"]["seed"] == 2


def test_demo_config_policies_and_instance(tmp_path: Path, wide: None) -> None:
    cfg = write(
        tmp_path / "demo.yaml",
        "policies: [vllm, edf]\ninstance: {max_running: 16, cost_model: 'constant:0.01'}\n",
    )
    out_dir = tmp_path / "demo"
    invoke("demo", "--config", cfg, "--duration", "10", "--out", out_dir)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert list(summary) == ["vllm", "edf"]
    assert summary["edf"]["limits"]["max_running"] == 16


def test_demo_config_merges_into_builtin(tmp_path: Path, wide: None) -> None:
    cfg = write(tmp_path / "short.yaml", "workload:\n  duration_s: 10\n")
    out_dir = tmp_path / "demo"
    invoke("demo", "--config", cfg, "--policies", "vllm", "--out", out_dir)
    workload = json.loads((out_dir / "config.json").read_text())["config"]["workload"]
    assert workload["duration_s"] == 10.0
    assert workload["arrival"]["kind"] == "bursty"
