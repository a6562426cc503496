"""The Andes reproduction's plots (one per experiment, as Andes Figures 15–20) and its
summary table."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def plot(results: pd.DataFrame, out_dir: Path) -> None:
    """One figure per experiment: mean QoE against its knob, a line per policy/variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xlabels = {
        "intensity": "burst intensity (Fig. 15)",
        "duration": "burst duration (Fig. 16)",
        "poisson": "Poisson rate / capacity (Fig. 20)",
        "burstgpt": "BurstGPT replay speed-up (§6.2)",
        "refiner": "burst duration (Fig. 17)",
        "solver": "burst intensity (Fig. 18)",
        "delta_t": "Δt, s (Fig. 19)",
    }
    for exp, g in results.groupby("experiment"):
        scen = sorted({(p, m) for p, m in zip(g["profile"], g["mix"], strict=True)})
        fig, axes = plt.subplots(1, len(scen), figsize=(4.2 * len(scen), 3.4), squeeze=False)
        for ax, (profile, mix) in zip(axes[0], scen, strict=True):
            s = g[(g["profile"] == profile) & (g["mix"] == mix)]
            for label, line in s.groupby("label"):
                line = line.sort_values("x")
                ax.plot(line["x"], line["qoe_mean"], marker="o", label=str(label))
            ax.axhline(0.95, color="grey", lw=0.7, ls="--")
            ax.set_title(f"{profile}\n{mix}", fontsize=9)
            ax.set_xlabel(xlabels.get(str(exp), str(exp)))
            ax.set_ylabel("mean QoE")
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / f"{exp}.png", dpi=110)
        plt.close(fig)


def summary_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean QoE per experiment, scenario and policy/variant (averaged over the knob)."""
    return (
        results.groupby(["experiment", "profile", "mix", "label"])["qoe_mean"]
        .mean()
        .unstack("label")
        .round(3)
    )
