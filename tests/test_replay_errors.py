"""The replay reports the first bad row's error (``workloads/replay.py``): per-row values
are computed column by column, and a priority that is no integer (±inf: ``int()`` raises
OverflowError) must not be reported before an earlier row's SLO error, nor escape as an
OverflowError."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sloserve.core.errors import WorkloadError
from sloserve.workloads.replay import requests_from_rows
from sloserve.workloads.spec import WorkloadSpec


def _rows(priority: list[float], ttft: list[float]) -> dict[str, object]:
    n = len(priority)
    return {
        "arrival_s": np.arange(n, dtype=np.float64),
        "prompt_tokens": np.full(n, 10, dtype=np.int64),
        "output_tokens": np.full(n, 5, dtype=np.int64),
        "priority": np.asarray(priority, dtype=np.float64),
        "ttft_slo_s": np.asarray(ttft, dtype=np.float64),
    }


def _build(rows: dict[str, object]) -> None:
    spec = WorkloadSpec(trace="t.csv")
    requests_from_rows(rows, spec, np.random.default_rng(0))


@pytest.mark.parametrize("bad", [math.inf, -math.inf, 2.5, 3e9])
def test_a_bad_priority_is_its_rows_error_naming_file_field_and_value(bad: float) -> None:
    with pytest.raises(WorkloadError) as e:
        _build(_rows([1.0, math.nan, bad, 2.0], [math.nan] * 4))
    msg = str(e.value)
    assert msg.startswith("t.csv: request 2: priority must be an integer")
    assert msg.endswith(f"({bad})")


def test_an_earlier_rows_error_comes_before_a_later_bad_priority() -> None:
    with pytest.raises(WorkloadError) as e:
        _build(_rows([1.0, 0.0, math.inf], [math.nan, -1.0, math.nan]))
    assert str(e.value).startswith("t.csv: request 1: ")
    assert "priority" not in str(e.value)


def test_good_priorities_are_unchanged() -> None:
    spec = WorkloadSpec(trace="t.csv")
    reqs = requests_from_rows(
        _rows([1.0, math.nan, -4.0], [math.nan] * 3), spec, np.random.default_rng(0)
    )
    rule = spec.rules()[reqs[1].req_class].priority
    assert [r.priority for r in reqs] == [1, rule, -4]
