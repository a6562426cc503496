"""Plots a reader can trust: distinct colour-blind-safe styles past ten series, coincident
series named in the legend, a QoE CDF of all-perfect runs said in words, and SLO verdicts
stored as booleans in requests.parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from sloserve.experiments.plotstyle import OKABE_ITO, coincident_labels, series_style
from sloserve.experiments.report import BOOL_COLUMNS, as_stored, plot_report, write_report
from sloserve.experiments.runner import SimConfig, compare

CFG = {
    "workload": {
        "duration_s": 10,
        "arrival": {"kind": "poisson", "rate": 2},
        "classes": {"rt": 0.5, "be": 0.5},
    },
    "instance": {"cost_model": "constant:0.01"},
}


def test_styles_never_repeat_in_forty_series() -> None:
    styles = [(s["color"], str(s["linestyle"])) for s in map(series_style, range(40))]
    assert len(set(styles)) == 40
    assert styles[8][0] == styles[0][0] and styles[8][1] != styles[0][1]
    assert set(OKABE_ITO) == {c for c, _ in styles}


def test_coincident_series_are_named() -> None:
    a = np.array([0.1, 0.2, 0.3])
    labels = coincident_labels({"vllm": a, "edf": a * 2, "sarathi": a.copy(), "x": a * 2})
    assert labels == {"vllm": "vllm", "edf": "edf", "sarathi": "sarathi (= vllm)", "x": "x (= edf)"}
    assert coincident_labels({"a": [], "b": []}) == {"a": "a", "b": "b"}


def _captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    figs: dict[str, Any] = {}
    real = plt.Figure.savefig

    def spy(fig: Any, path: Any, *a: Any, **k: Any) -> None:
        figs[Path(path).name] = fig
        real(fig, path, *a, **k)

    monkeypatch.setattr(plt.Figure, "savefig", spy)
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    return figs


def test_report_legends_name_coincident_runs_and_qoe_wall_is_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the same run under two names (as two policies that schedule alike), light load: every
    # QoE is 1
    one = compare(SimConfig.model_validate(CFG), ["vllm"])["vllm"]
    res = {"vllm": one, "sarathi": one}
    figs = _captured(monkeypatch)
    plot_report(res, tmp_path)
    legend = [t.get_text() for t in figs["cdf_ttft.png"].axes[0].get_legend().get_texts()]
    assert legend == ["vllm", "sarathi (= vllm)"]
    lines = figs["cdf_ttft.png"].axes[0].get_lines()
    assert lines[0].get_color() != lines[1].get_color()
    qoe = figs["cdf_qoe.png"].axes[0]
    assert not qoe.get_lines()  # no wall drawn
    text = " ".join(t.get_text() for t in qoe.texts)
    assert "QoE ≈ 1" in text and "vllm" in text


def test_requests_parquet_stores_slo_verdicts_as_booleans(tmp_path: Path) -> None:
    res = compare(SimConfig.model_validate(CFG), ["vllm"])
    mem = res["vllm"].table
    assert mem["slo_ok"].dtype == np.float64  # the in-memory table is unchanged
    write_report(res, tmp_path, plots=False)
    disk = pd.read_parquet(tmp_path / "requests.parquet")
    for c in BOOL_COLUMNS:
        assert str(disk[c].dtype) == "boolean", c
        # NaN (no such SLO) -> <NA>; 1.0/0.0 -> True/False; attainment unchanged
        assert disk[c].isna().tolist() == mem[c].isna().tolist()
        if mem[c].notna().any():
            assert float(disk[c].mean()) == pytest.approx(mem[c].mean())
    assert disk["deadline_ok"].isna().all() and disk["slo_ok"].notna().any()
    t = as_stored(pd.DataFrame({"slo_ok": [1.0, 0.0, np.nan], "x": [1.0, 2.0, 3.0]}))
    assert t["slo_ok"].tolist()[:2] == [True, False] and t["slo_ok"].isna().tolist()[2]
    assert t["x"].dtype == np.float64
