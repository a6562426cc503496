"""The pandas-free CSV reading of sloserve traces gives pandas' cells, lines and numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sloserve.core import textcsv
from sloserve.core.csvio import read_strict_csv
from sloserve.core.errors import WorkloadError
from sloserve.core.textcsv import _plain_csv, read_text_columns, texts, to_floats
from sloserve.workloads.trace import read_trace

_cell = st.one_of(
    st.just(""),
    st.floats(0, 1e7, allow_nan=False).map(repr),
    st.floats(0, 1e3, allow_nan=False).map(lambda v: f"{v:.20f}"),
    st.integers(0, 10**7).map(str),
    st.sampled_from(["rt", "be", "default", "llama-2-7b", "1e5", ".5", "5.", "-0"]),
)


def _pandas_columns(path: Path) -> tuple[dict[str, list[object]], np.ndarray]:
    df, lines = read_strict_csv(path, "trace file", WorkloadError)
    return {c: [v if isinstance(v, str) else None for v in df[c]] for c in df.columns}, lines


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    width=st.integers(1, 5),
    rows=st.lists(st.one_of(st.none(), st.lists(_cell, min_size=5, max_size=5)), max_size=12),
    final_newline=st.booleans(),
)
def test_plain_files_read_as_pandas_reads_them(
    tmp_path: Path, width: int, rows: list[list[str] | None], final_newline: bool
) -> None:
    """Blank lines (None), rows of empty cells and empty cells: the same columns and the
    same line of each row as pandas' reader."""
    header = ",".join(f"c{j}" for j in range(width))
    body = ["" if r is None else ",".join(r[:width]) for r in rows]
    path = tmp_path / "t.csv"
    path.write_text("\n".join([header, *body]) + ("\n" if final_newline else ""))
    plain = _plain_csv(path)
    want_cols, want_lines = _pandas_columns(path)
    if plain is None:  # no data row: the pandas path reads it (and reports it)
        assert not any(r is not None and any(r[:width]) for r in rows)
        return
    cols, lines = plain
    assert cols == want_cols
    np.testing.assert_array_equal(lines, want_lines)


@pytest.mark.parametrize(
    "text",
    [
        'a,b\n"1",2\n',  # quotes
        "a,b\n 1,2\n",  # a space
        "a,b\r\n1,2\r\n",  # CRLF
        "a,b\n1,2,3\n",  # a row longer than the header
        "a,b\n1\n",  # a row shorter than the header
        "a,b\n1,2,3\n4\n",  # one longer, one shorter: the right number of commas in all
        "\ufeffa,b\n1,2\n",  # BOM
        "a,b\u00a0\n1,2\n",  # NBSP after a header name (pandas strips it)
        "a\x0b,b\n1,2\n",  # vertical tab in a header name
        "a,\x0cb\n1,2\n",  # form feed in a header name
        "a,b\n1\u00a0,2\n",  # NBSP in a cell
    ],
)
def test_other_files_go_through_pandas(tmp_path: Path, text: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8")
    assert _plain_csv(path) is None
    try:
        want = _pandas_columns(path)
    except WorkloadError as e:
        with pytest.raises(WorkloadError, match="more fields"):
            read_text_columns(path, "trace file", WorkloadError)
        assert "more fields" in str(e)
        return
    cols, lines = read_text_columns(path, "trace file", WorkloadError)
    assert {c: texts(v) for c, v in cols.items()} == want[0]
    np.testing.assert_array_equal(lines, want[1])


@given(st.lists(st.one_of(st.none(), _cell.filter(bool)), max_size=30))
def test_to_floats_is_pandas_to_numeric(cells: list[str | None]) -> None:
    got = to_floats(cells)
    want = pd.to_numeric(pd.Series(cells, dtype=str), errors="coerce").to_numpy(np.float64)
    np.testing.assert_array_equal(got, want)


def test_to_floats_odd_cells_are_pandas_own() -> None:
    cells = ["1.5", "inf", "nan", "abc", "+5", "1_0", "12345678901234567890", None, "-2e-3"]
    want = pd.to_numeric(pd.Series(cells, dtype=str), errors="coerce").to_numpy(np.float64)
    np.testing.assert_array_equal(to_floats(cells), want)


def test_a_trace_reads_the_same_with_and_without_pandas(tmp_path: Path) -> None:
    """A trace with every column, blank lines and empty cells: the pandas-free reading and a
    forced pandas reading give the same columns (and the file is read the fast way)."""
    rng = np.random.default_rng(3)
    lines = ["arrival_s,prompt_tokens,output_tokens,class,priority,model,ttft_slo_s"]
    t = 0.0
    for i in range(200):
        t += float(rng.exponential(0.3))
        slo = repr(float(rng.uniform(0.1, 5))) if i % 3 else ""
        cls = ("rt", "be", "")[i % 3]
        lines.append(
            f"{t!r},{rng.integers(1, 4000)},{rng.integers(1, 900)},{cls},{i % 4},m{i % 2},{slo}"
        )
        if i % 50 == 7:
            lines.append("")
    path = tmp_path / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    assert _plain_csv(path) is not None
    fast = read_trace(path)
    quoted = tmp_path / "q.csv"  # one quoted header name: the pandas path, same cells
    quoted.write_text('"arrival_s"' + path.read_text()[len("arrival_s") :])
    assert _plain_csv(quoted) is None
    slow = read_trace(quoted)
    for name in ("arrival", "prompt", "output", "priority"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name))
    assert fast.req_class == slow.req_class and fast.model == slow.model
    assert fast.slo.keys() == slow.slo.keys()
    np.testing.assert_array_equal(fast.slo["ttft_slo_s"], slow.slo["ttft_slo_s"])


@pytest.mark.parametrize("odd", ["\u00a0", "\x0b", "\x0c", "\u2028", "\x1c"])
def test_header_names_with_other_whitespace_are_stripped(tmp_path: Path, odd: str) -> None:
    """pandas' reading strips header names of any whitespace: the trace still reads."""
    path = tmp_path / "h.csv"
    path.write_text(f"arrival_s,prompt_tokens,output_tokens{odd}\n0,10,5\n", encoding="utf-8")
    t = read_trace(path)
    assert t.output.tolist() == [5] and t.prompt.tolist() == [10]


@pytest.mark.parametrize(
    "header",
    [
        "arrival_s,prompt_tokens,prompt_tokens,output_tokens",
        "arrival_s,prompt_tokens, prompt_tokens,output_tokens",
        'arrival_s,prompt_tokens,"prompt_tokens",output_tokens',
    ],
)
def test_a_repeated_column_name_is_an_error(tmp_path: Path, header: str) -> None:
    """pandas renames the second one (prompt_tokens.1), which was then ignored."""
    path = tmp_path / "d.csv"
    path.write_text(f"{header}\n0,10,11,5\n")
    assert _plain_csv(path) is None
    with pytest.raises(WorkloadError, match=r"d\.csv: column prompt_tokens appears more than"):
        read_trace(path)


def test_a_file_over_the_size_limit_reads_through_pandas_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above TEXT_PATH_MAX_BYTES pandas' columns come back (no str object per cell), and
    the trace, its errors included, is the same."""
    rows = ["arrival_s,prompt_tokens,output_tokens,class,priority,model,ttft_slo_s"]
    rows += [
        f"{0.5 * i},{10 + i},{1 + i % 7},{('rt', 'be', '')[i % 3]},{i % 2},m," for i in range(50)
    ]
    path = tmp_path / "t.csv"
    path.write_text("\n".join(rows) + "\n\n")
    small = read_trace(path)
    cols, _ = read_text_columns(path, "trace file", WorkloadError)
    assert isinstance(cols["arrival_s"], list)
    monkeypatch.setattr(textcsv, "TEXT_PATH_MAX_BYTES", path.stat().st_size - 1)
    cols, _ = read_text_columns(path, "trace file", WorkloadError)
    assert isinstance(cols["arrival_s"], pd.Series)
    big = read_trace(path)
    for name in ("arrival", "prompt", "output", "priority"):
        np.testing.assert_array_equal(getattr(big, name), getattr(small, name))
    assert big.req_class == small.req_class and big.model == small.model
    np.testing.assert_array_equal(big.slo["ttft_slo_s"], small.slo["ttft_slo_s"])
    bad = tmp_path / "bad.csv"
    bad.write_text(path.read_text().replace("\n3.0,16,", "\n3.0,many,"))
    monkeypatch.setattr(textcsv, "TEXT_PATH_MAX_BYTES", 0)
    with pytest.raises(
        WorkloadError, match=r"line 8, column prompt_tokens: not a number \('many'\)"
    ):
        read_trace(bad)


def test_every_whitespace_but_newline_makes_a_file_unplain() -> None:
    spaces = {chr(c) for c in range(0x110000) if chr(c).isspace()} - {"\n"}
    matched = {chr(c) for c in range(0x110000) if textcsv._UNPLAIN.match(chr(c))}
    assert spaces <= matched and "\n" not in matched
    assert matched - spaces == {'"', "\ufeff", "\x00"}
