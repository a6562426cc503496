"""Helpers for in-process tests of the ``sloserve`` command line (typer's CliRunner):
fast-run flags, the expected summary keys and report files, running a command and
parsing its strict JSON, and dropping the wall-clock time from a summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from sloserve.cli import app

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
