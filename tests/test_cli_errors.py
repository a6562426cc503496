"""The real exit-status / one-line-error contract of the ``sloserve`` command line: user
errors exit 2 with one ``sloserve: error:`` line, both through ``main()`` in process and
through the console entry point in subprocesses (started together, once per module),
plus the entry point's help, console script and ``profiles`` runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_app_helpers import (
    FAST,
)
from cli_helpers import assert_user_error, cli_argv, run_main, run_many, write
from sloserve.cli import app
from sloserve.core.errors import SloserveError


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
        "trace_twice": write(
            d / "twice.csv", "arrival_s,prompt_tokens,prompt_tokens,output_tokens\n0,10,11,5\n"
        ),
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
        "trace-repeated-column",
        ["simulate", "--trace", "{trace_twice}"],
        ["twice.csv", "column prompt_tokens", "more than once"],
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


def test_profiles_entry_point(entry: dict[str, subprocess.CompletedProcess[str]]) -> None:
    proc = entry["profiles"]  # COLUMNS=200
    assert proc.returncode == 0, proc.stderr
    assert "llama-2-7b-a100" in proc.stdout
    assert "llama-2-70b-a100x2" in proc.stdout
