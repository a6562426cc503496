"""The tables `sloserve reproduce andes` prints: tidy (no NaN cell from pivoting
experiments that ran different policies, each headline ratio once), and its figures titled
for what they show."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sloserve.experiments.andes import (
    PAPER,
    ablation_table,
    headline,
    headline_table,
    plot,
    policy_table,
    sustained_table,
)
from sloserve.experiments.andes.figures import TITLES


def _results() -> pd.DataFrame:
    rows = []
    for exp, xs in (("intensity", (1.5, 2.0, 2.5)), ("duration", (0.2, 0.35))):
        for k, pol in enumerate(("vllm", "sarathi", "lqsf", "andes")):
            for x in xs:
                q = 1.0 if pol == "andes" else min(1.0, 1.3 - 0.05 * k - 0.15 * x)
                rows.append((exp, pol, pol, x, q, 0.1 * k, 40.0))
    for label in ("refiner on", "refiner off"):
        rows.append(
            ("refiner", "andes", label, 0.35, 0.9, 0.1 if label == "refiner on" else 0.5, 40.0)
        )
    for label in ("greedy", "dp"):
        rows.append(("solver", "andes", label, 2.0, 0.95, 0.0, 40.0))
    for dt in (0.5, 1.0):
        rows.append(("delta_t", "andes", "andes", dt, 0.97, 0.0, 40.0))
    df = pd.DataFrame(
        rows,
        columns=[
            "experiment",
            "policy",
            "label",
            "x",
            "qoe_mean",
            "preemptions_per_request",
            "tds_mean",
        ],
    )
    df["profile"] = "llama-2-7b-a100"
    df["mix"] = "andes-sharegpt"
    return df


def test_policy_table_has_no_nan_and_policies_in_order() -> None:
    t = policy_table(_results())
    assert list(t.columns) == ["experiment", "scenario", "vllm", "sarathi", "lqsf", "andes"]
    assert list(t["experiment"]) == ["intensity", "duration"]
    assert not t.isna().any().any()
    assert (t["andes"] == 1.0).all()


def test_ablation_table_is_long_and_complete() -> None:
    t = ablation_table(_results())
    assert list(t["experiment"]) == ["refiner", "refiner", "solver", "solver", "delta_t", "delta_t"]
    assert list(t["variant"][-2:]) == ["Δt = 0.5 s", "Δt = 1 s"]
    assert not t.isna().any().any()
    on = t[t["variant"] == "refiner on"]["preemptions_per_request"].item()
    assert on == 0.1


def test_headline_table_shows_each_ratio_once() -> None:
    head = headline(_results())
    scen = head["scenarios"]["llama-2-7b-a100/andes-sharegpt"]
    # the two keys are the same number: the table must not show it twice
    assert scen["realised_gain"] == scen["intensity_ratio_at_qoe_0.95"]
    t = headline_table(head)
    assert len(t) == len(set(t["headline"])) == 8
    ours = t["llama-2-7b-a100/andes-sharegpt"].tolist()
    ratio = f"{scen['intensity_ratio_at_qoe_0.95']:.2f}×"
    assert ours.count(ratio) == 1
    row = t[t["headline"].str.contains("realised gain")]
    assert row["paper"].item() == f"{PAPER['intensity_ratio_at_qoe_0.95']:.2f}× (realised 1.40×)"
    s = sustained_table(head)
    assert list(s.columns) == ["scenario", "vllm", "sarathi", "lqsf", "andes"]


def test_every_figure_is_titled_for_what_it_shows(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles: list[str] = []
    real_savefig = plt.Figure.savefig

    def spy(fig: plt.Figure, *a: object, **k: object) -> None:
        titles.append(fig.get_suptitle())
        real_savefig(fig, *a, **k)  # type: ignore[arg-type]

    plt.Figure.savefig = spy  # type: ignore[method-assign]
    try:
        plot(_results(), tmp_path)
    finally:
        plt.Figure.savefig = real_savefig  # type: ignore[method-assign]
    assert (tmp_path / "duration.png").stat().st_size > 0
    assert TITLES["duration"] in titles
    assert "burst duration" in TITLES["duration"] and "intensity" not in TITLES["duration"]
    assert len(titles) == 5 and all(titles)


def test_headline_has_the_max_and_the_mean_ratio_of_each_sweep() -> None:
    res = _results()
    scen = headline(res)["scenarios"]["llama-2-7b-a100/andes-sharegpt"]
    e = res[res["experiment"] == "intensity"]
    piv = e.pivot_table(index="x", columns="policy", values="qoe_mean")
    ratios = piv["andes"] / piv["vllm"]
    assert scen["qoe_ratio_vs_vllm_intensity"] == pytest.approx(ratios.max())
    assert scen["qoe_ratio_vs_vllm_intensity_mean"] == pytest.approx(ratios.mean())
