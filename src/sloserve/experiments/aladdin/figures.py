"""Aladdin's figures from the reproduction's data: GPUs needed vs arrival rate (Fig. 11)."""

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
