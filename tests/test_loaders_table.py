"""The generic table trace format (``load_table`` / ``parse_columns``): CSV, JSON Lines
and Parquet files with named columns, seconds or timestamp arrivals, class / model
labels, lengths-only tables, and the errors for missing mappings, missing columns,
bad timestamps and unsorted rows."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sloserve.core.errors import WorkloadError
from sloserve.workloads import ConstantArrivals, WorkloadSpec
from sloserve.workloads.loaders import (
    load_table,
    load_trace,
    parse_columns,
)
from sloserve.workloads.spec import build_requests, build_workload
from workload_helpers import (
    BE,
    RT,
    arrivals,
    pairs,
    write,
)

# ============================================================================ table format
COLS = "arrival_s=t,prompt_tokens=p,output_tokens=o"


def test_parse_columns() -> None:
    assert parse_columns(COLS) == {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o"}
    assert parse_columns(" prompt_tokens = in tokens , output_tokens=out") == {
        "prompt_tokens": "in tokens",
        "output_tokens": "out",
    }
    assert parse_columns(None) == {}
    assert parse_columns({"prompt_tokens": "x"}) == {"prompt_tokens": "x"}
    for bad in ("arrival_s", "prompt_tokens=b,,output_tokens=d", "=x", "Prompt=p"):
        with pytest.raises(WorkloadError, match="expected name=column pairs"):
            parse_columns(bad)
    for typo in ("arival_s=t,prompt_tokens=p,output_tokens=o",):
        with pytest.raises(WorkloadError, match="unknown name"):
            parse_columns(typo)


def test_table_csv_seconds(tmp_path: Path) -> None:
    p = write(tmp_path / "t.csv", "t,p,o,extra\n1.5,10,5,x\n2.0,20,6,y\n4.25,30,7,z\n")
    t = load_table(p, parse_columns(COLS))
    assert t.source == "table:t.csv"
    assert t.df["arrival_s"].tolist() == [0.0, 0.5, 2.75]
    assert t.df["prompt_tokens"].tolist() == [10, 20, 30]
    assert t.df["output_tokens"].tolist() == [5, 6, 7]
    assert "extra" not in t.df.columns
    w = build_workload(
        WorkloadSpec(trace=str(p), trace_format="table", trace_columns=parse_columns(COLS))
    )
    assert arrivals(w.requests).tolist() == [0.0, 0.5, 2.75]


def test_table_jsonl_iso_timestamps(tmp_path: Path) -> None:
    rows = [
        {"t": "2024-01-01T00:00:00Z", "p": 10, "o": 5},
        {"t": "2024-01-01T00:00:01.5Z", "p": 20, "o": 6},
        {"t": "2024-01-01T00:01:00Z", "p": 30, "o": 7},
    ]
    p = write(tmp_path / "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    t = load_table(p, parse_columns(COLS))
    assert t.df["arrival_s"].tolist() == [0.0, 1.5, 60.0]
    assert t.df["prompt_tokens"].tolist() == [10, 20, 30]


def test_table_jsonl_bad_value_names_row(tmp_path: Path) -> None:
    p = write(tmp_path / "t.jsonl", '{"t":0,"p":10,"o":5}\n{"t":1,"p":"x","o":5}\n')
    with pytest.raises(
        WorkloadError, match=r"t\.jsonl, line 2, column p: not a finite number \('x'\)"
    ):
        load_table(p, parse_columns(COLS))


def test_table_parquet_seconds_and_labels(tmp_path: Path) -> None:
    p = tmp_path / "t.parquet"
    pd.DataFrame(
        {
            "t": [0.0, 1.0, 3.0],
            "p": [10, 20, 30],
            "o": [5, 6, 7],
            "cls": ["rt", "be", "BE"],
            "m": ["a", "b", "a"],
        }
    ).to_parquet(p)
    cols = {**parse_columns(COLS), "class": "cls", "model": "m"}
    t = load_table(p, cols)
    assert t.df["arrival_s"].tolist() == [0.0, 1.0, 3.0]
    assert t.df["class"].tolist() == ["rt", "be", "BE"]
    reqs = build_requests(
        WorkloadSpec(trace=str(p), trace_format="table", trace_columns=cols, slo="qlm")
    )
    assert [r.req_class for r in reqs] == [RT, BE, BE]
    assert [r.model for r in reqs] == ["a", "b", "a"]
    assert [r.slo.deadline_s for r in reqs] == [30.0, 300.0, 300.0]


def test_table_parquet_datetimes(tmp_path: Path) -> None:
    p = tmp_path / "ts.parquet"
    pd.DataFrame(
        {
            "t": pd.to_datetime(
                ["2024-01-01 00:00:00", "2024-01-01 00:00:02.25"], format="ISO8601"
            ),
            "p": [10, 20],
            "o": [5, 6],
        }
    ).to_parquet(p)
    assert load_table(p, parse_columns(COLS)).df["arrival_s"].tolist() == [0.0, 2.25]


def test_table_without_arrivals_is_lengths_only(tmp_path: Path) -> None:
    p = write(tmp_path / "len.csv", "p,o\n10,5\n20,6\n")
    t = load_table(p, {"prompt_tokens": "p", "output_tokens": "o"})
    assert not t.has_arrivals
    spec = WorkloadSpec(
        trace=str(p),
        trace_format="table",
        trace_columns={"prompt_tokens": "p", "output_tokens": "o"},
        arrival=ConstantArrivals(rate=2.0),
        duration_s=5,
    )
    w = build_workload(spec)
    assert arrivals(w.requests).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5]
    assert set(pairs(w.requests)) <= {(10, 5), (20, 6)}
    assert any("no arrival times" in n for n in w.notes)


def test_table_missing_mapping_and_columns(tmp_path: Path) -> None:
    p = write(tmp_path / "t.csv", "t,p,o\n0,10,5\n")
    with pytest.raises(WorkloadError, match=r"t\.csv: name the file's column for output_tokens$"):
        load_table(p, {"arrival_s": "t", "prompt_tokens": "p"})
    with pytest.raises(
        WorkloadError, match="name the file's column for output_tokens, prompt_tokens"
    ):
        load_trace(p, "table")
    with pytest.raises(WorkloadError, match=r"t\.csv: missing column\(s\) nope; have t, p, o"):
        load_table(p, {"arrival_s": "nope", "prompt_tokens": "p", "output_tokens": "o"})


def test_table_bad_timestamp_and_unsorted(tmp_path: Path) -> None:
    p = write(tmp_path / "t.csv", "t,p,o\n2024-01-01T00:00:00,10,5\nlater,20,6\n")
    with pytest.raises(
        WorkloadError, match=r"t\.csv, line 3, column t: not a timestamp \('later'\)"
    ):
        load_table(p, parse_columns(COLS))
    p = write(tmp_path / "u.csv", "t,p,o\n0,10,5\n2,20,6\n1,30,7\n")
    with pytest.raises(WorkloadError, match=r"u\.csv, line 4.*not sorted"):
        load_table(p, parse_columns(COLS))
    t = load_table(p, parse_columns(COLS), strict=False)
    assert t.df["arrival_s"].tolist() == [0.0, 1.0, 2.0]
    assert t.df["prompt_tokens"].tolist() == [10, 30, 20]
    assert t.notes == ["1 out-of-order arrival(s) sorted"]
