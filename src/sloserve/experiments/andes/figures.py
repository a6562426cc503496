"""The Andes reproduction's plots (one per experiment, as Andes Figures 15–20); its tables
are in :mod:`.tables`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

TITLES = {
    "intensity": "Mean QoE vs burst intensity (Andes Fig. 15)",
    "duration": "Mean QoE vs burst duration, fraction of the cycle (Andes Fig. 16)",
    "poisson": "Mean QoE vs Poisson load (Andes Fig. 20)",
    "burstgpt": "Mean QoE on the BurstGPT trace vs replay speed-up (Andes §6.2)",
    "refiner": "Andes' refiner on and off vs burst duration (Andes Fig. 17)",
    "solver": "Andes' greedy vs DP solver vs burst intensity (Andes Fig. 18)",
    "delta_t": "Andes' scheduling interval Δt (Andes Fig. 19)",
}
"""Each figure's title: what it plots against what (the file is named by experiment)."""


def plot(results: pd.DataFrame, out_dir: Path) -> None:
    """One figure per experiment: mean QoE against its knob, a line per policy/variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sloserve.experiments.plotstyle import coincident_labels, series_style

    xlabels = {
        "intensity": "burst intensity",
        "duration": "burst duration (fraction of the cycle)",
        "poisson": "Poisson rate / capacity",
        "burstgpt": "BurstGPT replay speed-up",
        "refiner": "burst duration (fraction of the cycle)",
        "solver": "burst intensity",
        "delta_t": "Δt, s",
    }
    for exp, g in results.groupby("experiment"):
        scen = sorted({(p, m) for p, m in zip(g["profile"], g["mix"], strict=True)})
        fig, axes = plt.subplots(1, len(scen), figsize=(4.2 * len(scen), 3.8), squeeze=False)
        for ax, (profile, mix) in zip(axes[0], scen, strict=True):
            s = g[(g["profile"] == profile) & (g["mix"] == mix)]
            lines = {str(k): v.sort_values("x") for k, v in s.groupby("label", sort=False)}
            labels = coincident_labels({k: v["qoe_mean"].to_numpy() for k, v in lines.items()})
            for k, (label, line) in enumerate(lines.items()):
                ax.plot(
                    line["x"],
                    line["qoe_mean"],
                    marker="o",
                    label=labels[label],
                    **series_style(k),
                )
            ax.axhline(0.95, color="grey", lw=0.7, ls="--")
            ax.set_title(f"{profile} / {mix}", fontsize=9)
            ax.set_xlabel(xlabels.get(str(exp), str(exp)))
            ax.set_ylabel("mean QoE")
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(TITLES.get(str(exp), str(exp)), fontsize=10)
        fig.tight_layout()
        fig.savefig(out_dir / f"{exp}.png", dpi=110)
        plt.close(fig)
