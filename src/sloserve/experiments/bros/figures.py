"""BROS' reproduction figures and tables (§7): ``hybrid.png`` (Figures 10–11),
``micro.png`` (Figure 12), ``be_batch.png`` (ours), ``ablation.png`` (Figure 13),
``overhead.png`` (Figure 14), and the per-policy summary tables the CLI prints.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

COLORS = {
    # Okabe–Ito (colour-blind safe, sloserve.experiments.plotstyle)
    "bros": "#0072B2",
    "bros-nobicache": "#56B4E9",
    "vllm": "#D55E00",
    "rr": "#E69F00",
    "sarathi": "#009E73",
}
"""One colour per policy in every figure."""

_HYBRID_PANELS = (
    ("rt_norm_latency_s", "RT normalized latency (s/token)"),
    ("rt_ttft_attainment", "RT TTFT SLO attainment"),
    ("rt_tpot_attainment", "RT TPOT SLO attainment"),
    ("be_throughput_rps", "BE throughput (req/s)"),
)


def plot(results: pd.DataFrame, overhead: pd.DataFrame, out_dir: Path) -> None:
    """Figures from the data: ``hybrid.png`` (Figures 10–11), ``micro.png`` (Figure 12),
    ``ablation.png`` (Figure 13), ``overhead.png`` (Figure 14)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[str, tuple[tuple[str, str], ...]] = {
        "hybrid": _HYBRID_PANELS,
        "micro": (
            ("rt_norm_latency_s", "normalized latency (s/token)"),
            ("rt_throughput_rps", "throughput (req/s)"),
        ),
    }
    for exp, cols in panels.items():
        g = results[results["experiment"] == exp] if len(results) else results
        if not len(g):
            continue
        scen = sorted({(p, m) for p, m in zip(g["profile"], g["mix"], strict=True)})
        fig, axes = plt.subplots(
            len(cols), len(scen), figsize=(3.8 * len(scen), 2.8 * len(cols)), squeeze=False
        )
        for j, (profile, mix) in enumerate(scen):
            s = g[(g["profile"] == profile) & (g["mix"] == mix)]
            for i, (col, label) in enumerate(cols):
                ax = axes[i][j]
                for pol, line in s.groupby("policy"):
                    line = line.sort_values("load")
                    ax.plot(
                        line["rt_rate"], line[col], marker="o", label=str(pol),
                        color=COLORS.get(str(pol)),
                    )  # fmt: skip
                if "attainment" in col:
                    ax.set_ylim(-0.02, 1.02)
                if i == 0:
                    ax.set_title(f"{profile}\n{mix}", fontsize=9)
                ax.set_xlabel("RT rate (req/s)")
                ax.set_ylabel(label, fontsize=8)
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / f"{exp}.png", dpi=100)
        plt.close(fig)
    bb = results[results["experiment"] == "be_batch"] if len(results) else results
    if len(bb):
        fig, axes = plt.subplots(1, 4, figsize=(15, 3.2), squeeze=False)
        for ax, (col, label) in zip(axes[0], _HYBRID_PANELS, strict=True):
            for pol, line in bb.groupby("policy"):
                line = line.sort_values("be_batch_size")
                ax.plot(
                    line["be_batch_size"], line[col], marker="o", label=str(pol),
                    color=COLORS.get(str(pol)),
                )  # fmt: skip
            if "attainment" in col:
                ax.set_ylim(-0.02, 1.02)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("BE batch size (requests)")
            ax.set_ylabel(label, fontsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(f"{bb['profile'].iloc[0]} / {bb['mix'].iloc[0]}", fontsize=9)
        fig.tight_layout()
        fig.savefig(out_dir / "be_batch.png", dpi=100)
        plt.close(fig)
    abl = results[results["experiment"] == "ablation"] if len(results) else results
    if len(abl):
        m = abl.groupby("policy")[["rt_ttft_attainment", "rt_tpot_attainment"]].mean()
        fig, ax = plt.subplots(figsize=(4.5, 3.2))
        m.T.plot.bar(ax=ax, rot=0)
        ax.set_ylabel("RT SLO attainment")
        ax.set_xticks(range(2), ["TTFT", "TPOT"])
        ax.set_title("bidirectional KV blocks (Fig. 13)", fontsize=9)
        fig.tight_layout()
        fig.savefig(out_dir / "ablation.png", dpi=100)
        plt.close(fig)
    if len(overhead):
        fig, ax = plt.subplots(figsize=(4.5, 3.2))
        piv = overhead.pivot_table(index="queued", columns="policy", values="overhead_fraction")
        (piv * 100).plot.bar(ax=ax, rot=0)
        ax.axhspan(7.56, 9.52, color="grey", alpha=0.2, label="paper")
        ax.set_ylabel("scheduling time per iteration (%)")
        ax.set_xlabel("queued requests")
        ax.set_title("scheduling overhead (Fig. 14)", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "overhead.png", dpi=100)
        plt.close(fig)


SHORT_NAMES = {
    "rt_norm_latency_s": "RT norm lat (s/tok)",
    "rt_ttft_attainment": "TTFT att",
    "rt_tpot_attainment": "TPOT att",
    "be_throughput_rps": "BE req/s",
    "rt_throughput_rps": "RT req/s",
}


def summary_table(results: pd.DataFrame) -> pd.DataFrame:
    """Per experiment, scenario and policy: the reported metrics averaged over rates
    (the ``be_batch`` sensitivity runs are in :func:`be_batch_table`)."""
    cols = list(SHORT_NAMES)
    r = results[results["experiment"] != "be_batch"]
    t = r.groupby(["experiment", "profile", "mix", "policy"])[cols].mean().round(3)
    return t.rename(columns=SHORT_NAMES)


def be_batch_table(results: pd.DataFrame) -> pd.DataFrame:
    """The ``be_batch`` runs: per BE batch size and policy, the hybrid metrics."""
    r = results[results["experiment"] == "be_batch"]
    r = r.assign(be_batch_size=r["be_batch_size"].astype(int))
    cols = ["rt_norm_latency_s", "rt_ttft_attainment", "rt_tpot_attainment", "be_throughput_rps"]
    t = r.groupby(["be_batch_size", "policy"])[cols].mean().round(3)
    return t.rename(columns=SHORT_NAMES)
