"""The Azure trace loader (``load_azure``): the real trace, its default whole-trace replay,
bad rows / columns / files named by file, line and column, out-of-order arrivals (strict or
sorted with a note), and ``load_trace``'s format dispatch. The real trace is the Azure LLM
inference trace 2023 (conversation service, one hour, 19,366 requests), Microsoft Azure
Public Dataset (Azure/AzurePublicDataset), licensed CC-BY 4.0; it is the trace analysed in
Splitwise (ISCA 2024). It is read from the shared folder next to the repository and never
copied into it; its tests are skipped without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from sloserve.core.errors import WorkloadError
from sloserve.core.request import SLO
from sloserve.workloads import WorkloadSpec
from sloserve.workloads.loaders import (
    TraceTable,
    load_azure,
    load_trace,
)
from sloserve.workloads.spec import build_workload
from workload_helpers import (
    AZ_HEADER,
    AZ_ROW,
    RT,
    arrivals,
    azure_spec,
    needs_azure,
    pairs,
    write,
)


# ============================================================================ Azure
@needs_azure
def test_azure_real_trace_loads(azure: TraceTable) -> None:
    df = azure.df
    assert len(df) == 19_366
    assert azure.source == "azure:azure_llm_2023_conv.csv"
    assert list(df.columns) == ["arrival_s", "prompt_tokens", "output_tokens"]
    assert azure.has_arrivals
    a = df["arrival_s"].to_numpy()
    assert a[0] == 0.0
    assert np.all(np.diff(a) >= 0)
    assert 3_450 < a[-1] < 3_600  # one hour, minus the quiet tail
    assert len(df) / a[-1] == pytest.approx(5.5, abs=0.1)
    p, o = df["prompt_tokens"], df["output_tokens"]
    assert p.mean() == pytest.approx(1_155, abs=1)
    assert p.std() == pytest.approx(1_109, abs=1)
    assert p.max() == 14_050
    assert o.mean() == pytest.approx(211, abs=1)
    assert o.std() == pytest.approx(163, abs=1)
    assert o.max() == 1_000
    assert p.min() >= 1 and o.min() >= 1
    assert azure.notes == []  # sorted already, nothing dropped


@needs_azure
def test_azure_replay_default_duration_keeps_the_whole_trace(azure: TraceTable) -> None:
    w = build_workload(azure_spec())
    assert len(w.requests) == 19_366
    np.testing.assert_array_equal(arrivals(w.requests), azure.df["arrival_s"].to_numpy())
    assert pairs(w.requests[:3]) == list(
        zip(azure.df["prompt_tokens"][:3], azure.df["output_tokens"][:3], strict=True)
    )
    assert all(r.req_class is RT and r.slo == SLO() for r in w.requests[:100])
    assert w.notes == []


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        (AZ_ROW + "yesterday noon,10,5\n", ["line 3", "column TIMESTAMP", "yesterday noon"]),
        (AZ_ROW + "2023-11-16 18:15:47.0,ten,5\n", ["line 3", "column ContextTokens", "ten"]),
        (
            AZ_ROW + AZ_ROW + "2023-11-16 18:15:47.0,10,-5\n",
            ["line 4", "column GeneratedTokens", "-5"],
        ),
        (AZ_ROW + "2023-11-16 18:15:47.0,0,5\n", ["line 3", "column ContextTokens", "1 ≤ x"]),
        (AZ_ROW + "2023-11-16 18:15:47.0,12.5,5\n", ["line 3", "column ContextTokens", "integer"]),
    ],
    ids=["bad-timestamp", "non-numeric", "negative", "zero", "fraction"],
)
def test_azure_bad_rows_name_file_line_and_column(
    tmp_path: Path, body: str, needles: list[str]
) -> None:
    p = write(tmp_path / "az_bad.csv", AZ_HEADER + body)
    with pytest.raises(WorkloadError) as ei:
        load_azure(p)
    msg = str(ei.value)
    assert msg.startswith(str(p)), msg
    for n in needles:
        assert n in msg, (n, msg)


def test_azure_missing_column_names_file_and_column(tmp_path: Path) -> None:
    p = write(tmp_path / "az_cols.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n")
    with pytest.raises(WorkloadError, match=r"az_cols\.csv: missing column\(s\) GeneratedTokens"):
        load_azure(p)


def test_azure_empty_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no rows"):
        load_azure(write(tmp_path / "empty.csv", AZ_HEADER))
    with pytest.raises(WorkloadError, match="not found"):
        load_azure(tmp_path / "nope.csv")


UNSORTED = (
    AZ_HEADER
    + "2023-11-16 18:15:46.500,374,44\n"
    + "2023-11-16 18:15:48.000,10,5\n"
    + "2023-11-16 18:15:47.000,11,6\n"
)


def test_azure_unsorted_is_an_error_when_strict(tmp_path: Path) -> None:
    p = write(tmp_path / "az_unsorted.csv", UNSORTED)
    with pytest.raises(WorkloadError) as ei:
        load_azure(p)
    msg = str(ei.value)
    for n in (str(p), "line 4", "not sorted", "strict=False", "--no-strict"):
        assert n in msg, (n, msg)
    # the spec goes through the same loader
    with pytest.raises(WorkloadError, match="not sorted"):
        build_workload(WorkloadSpec(trace=str(p), trace_format="azure"))


def test_azure_unsorted_error_names_the_files_column(tmp_path: Path) -> None:
    p = write(tmp_path / "az_unsorted.csv", UNSORTED)
    with pytest.raises(WorkloadError, match="column TIMESTAMP"):
        load_azure(p)


def test_azure_unsorted_sorted_with_a_note_when_not_strict(tmp_path: Path) -> None:
    p = write(tmp_path / "az_unsorted.csv", UNSORTED)
    t = load_azure(p, strict=False)
    assert t.df["arrival_s"].tolist() == [0.0, 0.5, 1.5]
    # lengths move with their rows
    assert t.df["prompt_tokens"].tolist() == [374, 11, 10]
    assert t.df["output_tokens"].tolist() == [44, 6, 5]
    assert t.notes == ["1 out-of-order arrival(s) sorted"]
    w = build_workload(WorkloadSpec(trace=str(p), trace_format="azure", strict=False))
    assert arrivals(w.requests).tolist() == [0.0, 0.5, 1.5]
    assert "1 out-of-order arrival(s) sorted" in w.notes


def test_azure_unsorted_first_row_latest_still_starts_at_zero(tmp_path: Path) -> None:
    p = write(
        tmp_path / "az_late_first.csv",
        AZ_HEADER
        + "2023-11-16 18:15:50.0,1,2\n2023-11-16 18:15:47.0,3,4\n2023-11-16 18:15:48.0,5,6\n",
    )
    t = load_azure(p, strict=False)
    assert t.df["arrival_s"].tolist() == [0.0, 1.0, 3.0]
    assert t.df["prompt_tokens"].tolist() == [3, 5, 1]


def test_load_trace_dispatch_and_unknown_format(tmp_path: Path) -> None:
    p = write(tmp_path / "az.csv", AZ_HEADER + AZ_ROW)
    assert load_trace(p, "azure").df["prompt_tokens"].tolist() == [374]
    with pytest.raises(WorkloadError, match="unknown trace format 'csv'; valid: azure, burstgpt"):
        load_trace(p, "csv")  # type: ignore[arg-type]
    with pytest.raises(WorkloadError, match="needs a file"):
        load_trace(None, "azure")
    with pytest.raises(ValidationError, match="trace_format"):
        WorkloadSpec(trace=str(p), trace_format="csv")  # type: ignore[arg-type]
