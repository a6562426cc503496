"""Aladdin's figures from the reproduction's data: GPUs needed vs arrival rate (Figs. 11/12),
attainment and P99 ATGT on one machine (Figs. 9/10)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def gpus_figure(df: pd.DataFrame, path: Path) -> None:
    """One panel per scenario: fewest GPUs meeting the SLOs against the rate, per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scen = list(dict.fromkeys(df["scenario"]))
    fig, axes = plt.subplots(1, len(scen), figsize=(4.5 * len(scen), 3.4), squeeze=False)
    for ax, s in zip(axes[0], scen, strict=True):
        d = df[df["scenario"] == s]
        for arm, g in d.groupby("arm", sort=False):
            ax.plot(g["rate"], g["gpus"], marker="o", label=str(arm))
        ax.set_title(s)
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel("GPUs for the SLOs")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def testbed_figure(df: pd.DataFrame, path: Path) -> None:
    """Figs. 9/10: per scenario, SLO attainment (top) and P99 ATGT (bottom) vs the rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scen = list(dict.fromkeys(df["scenario"]))
    fig, axes = plt.subplots(2, len(scen), figsize=(4.2 * len(scen), 6.2), squeeze=False)
    for i, s in enumerate(scen):
        d = df[df["scenario"] == s]
        for arm, g in d.groupby("arm", sort=False):
            axes[0][i].plot(g["rate"], g["attainment"], marker="o", label=str(arm))
            axes[1][i].plot(g["rate"], g["p99_atgt_ms"], marker="o", label=str(arm))
        axes[0][i].set_title(f"{s} (one 4-GPU machine)")
        axes[0][i].set_ylabel("SLO attainment")
        axes[1][i].set_ylabel("P99 ATGT (ms)")
        axes[1][i].set_xlabel("arrival rate (req/s)")
        axes[0][i].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
