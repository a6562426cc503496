"""The BurstGPT trace loader (``load_burstgpt``): failed requests (0 response tokens)
dropped with a note or refused, re-zeroed arrivals, optional columns, bad values and
unsorted rows, and replaying it with request classes and models mapped from its
columns (``ReplayOptions.class_from`` / ``class_map`` / ``model_map``). Everything
runs on small synthetic files written by the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from sloserve.core.errors import WorkloadError
from sloserve.core.request import SLO
from sloserve.workloads import WorkloadSpec
from sloserve.workloads.loaders import (
    load_burstgpt,
)
from sloserve.workloads.spec import ReplayOptions, build_requests, build_workload
from workload_helpers import (
    AZ_HEADER,
    AZ_ROW,
    BE,
    RT,
    arrivals,
    write,
)

# ============================================================================ BurstGPT
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
BURST = BURST_HEADER + (
    "5,ChatGPT,100,20,120,Conversation log\n"
    "6.5,GPT-4,200,0,200,API log\n"
    "8,GPT-4,300,30,330,API log\n"
    "9,ChatGPT,50,0,50,Conversation log\n"
    "12.25,ChatGPT,40,10,50,Conversation log\n"
)


@pytest.fixture
def burst(tmp_path: Path) -> Path:
    return write(tmp_path / "burst.csv", BURST)


def test_burstgpt_drops_failures_with_a_note(burst: Path) -> None:
    t = load_burstgpt(burst)
    assert t.source == "burstgpt:burst.csv"
    df = t.df
    # Timestamp is seconds; the first request arrives at 0
    assert df["arrival_s"].tolist() == [0.0, 3.0, 7.25]
    assert df["prompt_tokens"].tolist() == [100, 300, 40]
    assert df["output_tokens"].tolist() == [20, 30, 10]
    assert df["model"].tolist() == ["ChatGPT", "GPT-4", "ChatGPT"]
    assert df["log_type"].tolist() == ["Conversation log", "API log", "Conversation log"]
    assert t.notes == ["dropped 2 failed request(s) (0 response tokens)"]


def test_burstgpt_failures_are_an_error_when_kept(burst: Path) -> None:
    with pytest.raises(WorkloadError) as ei:
        load_burstgpt(burst, drop_failures=False)
    msg = str(ei.value)
    for n in (str(burst), "line 3", "column Response tokens", "0 response tokens"):
        assert n in msg, (n, msg)
    with pytest.raises(WorkloadError, match="line 3"):
        build_workload(WorkloadSpec(trace=str(burst), trace_format="burstgpt", drop_failures=False))


def test_burstgpt_dropped_first_row_rezeroes_arrivals(tmp_path: Path) -> None:
    p = write(
        tmp_path / "b.csv",
        BURST_HEADER
        + "2,ChatGPT,10,0,10,API log\n3,ChatGPT,11,4,15,API log\n4.5,ChatGPT,12,5,17,API log\n",
    )
    t = load_burstgpt(p)
    assert t.df["arrival_s"].tolist() == [0.0, 1.5]
    assert t.notes == ["dropped 1 failed request(s) (0 response tokens)"]


def test_burstgpt_only_failures(tmp_path: Path) -> None:
    p = write(
        tmp_path / "fail.csv", BURST_HEADER + "0,ChatGPT,10,0,10,API log\n1,GPT-4,5,0,5,API log\n"
    )
    with pytest.raises(WorkloadError, match=r"fail\.csv: no successful requests left"):
        load_burstgpt(p)


def test_burstgpt_optional_columns_kept(tmp_path: Path) -> None:
    p = write(
        tmp_path / "b2.csv",
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "10,s1,1.5,ChatGPT,10,5,15,Conversation log\n"
        "12,s2,2.5,GPT-4,20,6,26,API log\n",
    )
    t = load_burstgpt(p)
    assert t.df["arrival_s"].tolist() == [0.0, 2.0]
    assert t.df["session"].tolist() == ["s1", "s2"]
    assert t.df["elapsed_s"].tolist() == [1.5, 2.5]
    assert t.notes == []


def test_burstgpt_missing_column_and_bad_value(tmp_path: Path) -> None:
    p = write(tmp_path / "nolog.csv", "Timestamp,Model,Request tokens,Response tokens\n0,x,1,1\n")
    with pytest.raises(WorkloadError, match=r"nolog\.csv: missing column\(s\) Log Type"):
        load_burstgpt(p)
    p = write(tmp_path / "badval.csv", BURST_HEADER + "0,x,1,1,2,API log\n1,x,lots,1,2,API log\n")
    with pytest.raises(
        WorkloadError, match=r"badval\.csv, line 3, column Request tokens: .*'lots'"
    ):
        load_burstgpt(p)


def test_burstgpt_unsorted_strict_and_not(tmp_path: Path) -> None:
    p = write(tmp_path / "u.csv", BURST_HEADER + "5,m,1,1,2,API log\n3,m,2,2,4,API log\n")
    with pytest.raises(WorkloadError, match=r"u\.csv, line 3.*not sorted"):
        load_burstgpt(p)
    t = load_burstgpt(p, strict=False)
    assert t.df["arrival_s"].tolist() == [0.0, 2.0]
    assert t.df["prompt_tokens"].tolist() == [2, 1]


def test_burstgpt_replay_maps_classes_and_models(burst: Path) -> None:
    spec = WorkloadSpec(
        trace=str(burst),
        trace_format="burstgpt",
        replay=ReplayOptions(
            class_from="log_type",
            class_map={"API log": BE},
            model_map={"ChatGPT": "llama-2-7b"},
        ),
    )
    w = build_workload(spec)
    assert [r.req_class for r in w.requests] == [RT, BE, RT]
    assert [r.model for r in w.requests] == ["llama-2-7b", "GPT-4", "llama-2-7b"]
    # each class gets its rule (bros: RT TTFT 0.4 s / TPOT 0.2 s, BE none)
    assert [r.slo for r in w.requests] == [SLO(0.4, 0.2), SLO(), SLO(0.4, 0.2)]
    assert arrivals(w.requests).tolist() == [0.0, 3.0, 7.25]
    assert "dropped 2 failed request(s) (0 response tokens)" in w.notes


def test_burstgpt_replay_class_from_model_and_default_class(burst: Path) -> None:
    spec = WorkloadSpec(
        trace=str(burst),
        trace_format="burstgpt",
        replay=ReplayOptions(class_from="model", class_map={"ChatGPT": RT}, default_class=BE),
    )
    assert [r.req_class for r in build_requests(spec)] == [RT, BE, RT]


def test_replay_class_from_a_missing_column(tmp_path: Path) -> None:
    p = write(tmp_path / "az.csv", AZ_HEADER + AZ_ROW)
    spec = WorkloadSpec(
        trace=str(p), trace_format="azure", replay=ReplayOptions(class_from="log_type")
    )
    with pytest.raises(
        WorkloadError, match="class_from='log_type', but the trace has no such column"
    ):
        build_requests(spec)
