"""The command line's help and listings in process: every command's ``--help`` names its
options, ``policies`` and ``profiles`` list what is built in, and names stay readable
in an 80-column terminal."""

from __future__ import annotations

import pytest

from cli_app_helpers import (
    FAST,
    SHORT,
    invoke,
)
from sloserve import cli

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


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ordinary 80-column terminal (also what a pipe gets by default)."""
    monkeypatch.setattr(cli.console, "_width", 80)


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


def test_profiles_names_readable_at_80_columns(narrow: None) -> None:
    out = invoke("profiles").stdout
    assert "llama-2-7b-a100" in out
    assert "llama-2-70b-a100x2" in out


def test_compare_table_names_policies_at_80_columns(narrow: None) -> None:
    out = invoke("compare", "--policies", "vllm,sarathi-nocp-ef", *SHORT, *FAST).stdout
    assert "sarathi-nocp-ef" in out
    assert "…" not in out
