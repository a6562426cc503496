"""TraceTable: the DataFrame constructor keeps working, and ``df`` once built is the data."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sloserve.workloads.trace_table import TraceTable


def test_df_keyword_construction() -> None:
    df = pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [3, 4]})
    t = TraceTable(df=df, source="x")
    assert t.df is df and t.source == "x" and t.notes == []
    assert t.names == ["arrival_s", "prompt_tokens"] and t.num_rows() == 2


def test_in_place_edit_of_built_df_is_seen() -> None:
    t = TraceTable(None, "x", columns={"arrival_s": [0.0, 1.0], "model": ["a", "b"]})
    assert t.texts("model") == ["a", "b"]  # read from the columns, no DataFrame yet
    t.df.loc[0, "model"] = "c"  # loaders edit t.df in place
    t.df["model"] = t.df["model"].str.upper()
    assert t.texts("model") == ["C", "B"]
    assert t.columns is None
    t.df.loc[1, "arrival_s"] = 5.0
    np.testing.assert_array_equal(t.numbers("arrival_s"), [0.0, 5.0])
    assert t.objects("model") == ["C", "B"] and t.num_rows() == 2
