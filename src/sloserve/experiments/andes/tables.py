"""The Andes reproduction's tables, tidy: one value per cell, no NaN from pivoting
experiments that ran different policies into one frame, each headline ratio once.

* :func:`policy_table`: mean QoE of every policy in the experiments that compare policies
  (intensity, duration, Poisson, BurstGPT), one row per experiment and scenario;
* :func:`ablation_table`: the Andes ablations (refiner, solver, Δt), one row per variant;
* :func:`sustained_table`: the largest burst intensity each policy sustains at QoE >= 0.95;
* :func:`headline_table`: our headline numbers per scenario beside the paper's.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from sloserve.experiments.andes.plan import POLICIES

_COMPARED = ("intensity", "duration", "poisson", "burstgpt")
_ABLATIONS = ("refiner", "solver", "delta_t")

HEADLINE_ROWS: tuple[tuple[str, str, str], ...] = (
    # (headline key, what it is, format); realised_gain is the intensity ratio itself, so it
    # is shown once, in that row (the paper's 2.6× and 1.4× are measured differently)
    ("qoe_ratio_vs_vllm_intensity", "max QoE ratio Andes / vLLM, intensity sweep", "x"),
    ("qoe_ratio_vs_vllm_intensity_mean", "mean QoE ratio Andes / vLLM, intensity sweep", "x"),
    ("qoe_ratio_vs_vllm_duration", "max QoE ratio Andes / vLLM, duration sweep", "x"),
    ("qoe_ratio_vs_vllm_duration_mean", "mean QoE ratio Andes / vLLM, duration sweep", "x"),
    (
        "intensity_ratio_at_qoe_0.95",
        "intensity sustained at QoE >= 0.95, Andes / vLLM (realised gain)",
        "x",
    ),
    ("gpu_savings_at_qoe_0.95", "GPU savings at QoE >= 0.95", "%"),
    ("ideal_gain", "ideal gain: vLLM token speed / reading speed", "x"),
    ("realised_share_of_ideal", "realised share of the ideal gain", "%"),
)


def _scenario(df: pd.DataFrame) -> pd.Series:
    return df["profile"] + " / " + df["mix"]


def policy_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean QoE (averaged over the experiment's knob) per experiment, scenario and policy;
    columns: experiment, scenario, then one per policy in :data:`POLICIES` order."""
    df = results[results["experiment"].isin(_COMPARED)].assign(scenario=_scenario)
    if not len(df):
        return pd.DataFrame(columns=["experiment", "scenario", *POLICIES])
    wide = df.pivot_table(
        index=["experiment", "scenario"], columns="policy", values="qoe_mean", aggfunc="mean"
    )
    order = [e for e in _COMPARED if e in set(df["experiment"])]
    wide = wide.reindex(order, level="experiment")
    cols = [p for p in POLICIES if p in wide.columns]
    cols += [p for p in wide.columns if p not in cols]
    return wide[cols].reset_index().rename_axis(columns=None)


def ablation_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per ablation variant: experiment, scenario, variant, mean QoE and
    preemptions per request (averaged over the knob)."""
    df = results[results["experiment"].isin(_ABLATIONS)].assign(scenario=_scenario)
    cols = ["experiment", "scenario", "variant", "qoe_mean", "preemptions_per_request"]
    if not len(df):
        return pd.DataFrame(columns=cols)
    # Δt's variants are its values; the others' are their labels
    variant = df["label"].where(
        df["experiment"] != "delta_t", "Δt = " + df["x"].map("{:g} s".format)
    )
    g = (
        df.assign(variant=variant)
        .groupby(["experiment", "scenario", "variant"], sort=False)[
            ["qoe_mean", "preemptions_per_request"]
        ]
        .mean()
        .reset_index()
    )
    rank = {e: k for k, e in enumerate(_ABLATIONS)}
    return g.sort_values("experiment", key=lambda s: s.map(rank), kind="stable")[cols]


def sustained_table(headline: dict[str, Any]) -> pd.DataFrame:
    """The largest burst intensity each policy sustains at mean QoE >= 0.95, per scenario
    (NaN: not even the lowest intensity of the grid)."""
    rows = []
    for scen, row in headline["scenarios"].items():
        rows.append({"scenario": scen, **row.get("max_intensity_at_qoe_0.95", {})})
    return pd.DataFrame(rows)


def headline_table(headline: dict[str, Any]) -> pd.DataFrame:
    """Rows: the headline numbers (each once); columns: what, one per scenario, paper."""
    paper = headline.get("paper", {})
    scenarios = headline["scenarios"]
    rows = []
    for key, what, kind in HEADLINE_ROWS:
        row: dict[str, Any] = {"headline": what}
        for scen, vals in scenarios.items():
            row[scen] = _fmt(vals.get(key), kind)
        ref = paper.get(key)
        row["paper"] = _fmt(ref, kind)
        if key == "intensity_ratio_at_qoe_0.95" and "realised_gain" in paper:
            row["paper"] += f" (realised {_fmt(paper['realised_gain'], kind)})"
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt(v: Any, kind: str) -> str:
    if not isinstance(v, (int, float)) or math.isnan(v):
        return "-"
    return f"{v:.0%}" if kind == "%" else f"{v:.2f}×"
