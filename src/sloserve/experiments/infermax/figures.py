"""InferMax reproduction plots: one figure per analysis (Figures 5, 6, 8, 9, 11 and 15–17
of ``papers/infermax.txt``, and the §4.5 CSP sweep).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from sloserve.experiments.infermax.headline import _pivot
from sloserve.experiments.infermax.plan import CSP_METRIC
from sloserve.experiments.plotstyle import series_style


def plot(results: pd.DataFrame, csp: pd.DataFrame | None, out_dir: Path) -> list[Path]:
    """One figure per analysis present in ``results`` (and the CSP sweep); the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        p = out_dir / f"{name}.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        written.append(p)

    def lines(ax: Any, df: pd.DataFrame, x: str, y: str, logx: bool = True) -> None:
        for k, (label, g) in enumerate(df.groupby("label", sort=True)):
            g = g.sort_values(x)
            style = series_style(k)
            if str(label).endswith("-ef"):  # eviction-free presets: always dashed
                style["linestyle"] = "--"
            ax.plot(g[x], g[y], marker="o", ms=3, label=str(label), **style)
        if logx:
            ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)

    metrics = [
        ("latency_s", "latency (s)"),
        ("tps", "TPS"),
        ("ttft_mean_s", "TTFT (s)"),
        ("tpot_mean_s", "TPOT (s)"),
        ("evictions", "evictions"),
        ("running_mean", "running size"),
    ]
    by = {a: g for a, g in results.groupby("analysis")} if len(results) else {}
    if "contention" in by:
        g = by["contention"]
        outs = sorted(set(g["O"]))
        fig, axes = plt.subplots(
            len(metrics), len(outs), figsize=(3.2 * len(outs), 13), squeeze=False
        )
        for j, o in enumerate(outs):
            for k, (col, name) in enumerate(metrics):
                ax = axes[k][j]
                lines(ax, g[g["O"] == o], "I", col)
                ax.set_title(f"O={o}" if k == 0 else "", fontsize=9)
                ax.set_ylabel(name if j == 0 else "")
                ax.set_xlabel("I" if k == len(metrics) - 1 else "")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"§4.2 high contention (Fig. 5), B={int(g['B'].iloc[0])}", fontsize=10)
        save(fig, "contention")
        # Fig. 6: TPS over the I × O grid, one heat map per preset
        labs = sorted(set(g["label"]))
        fig, axes = plt.subplots(1, len(labs), figsize=(3.4 * len(labs), 3.2), squeeze=False)
        for ax, lab in zip(axes[0], labs, strict=True):
            piv = g[g["label"] == lab].pivot_table(index="O", columns="I", values="tps")
            im = ax.imshow(piv.to_numpy(), aspect="auto", origin="lower", cmap="viridis")
            ax.set_xticks(range(len(piv.columns)), [str(c) for c in piv.columns], fontsize=6)
            ax.set_yticks(range(len(piv.index)), [str(c) for c in piv.index], fontsize=6)
            ax.set_xlabel("I")
            ax.set_ylabel("O")
            ax.set_title(f"{lab}: TPS", fontsize=9)
            fig.colorbar(im, ax=ax)
        save(fig, "contention_tps")
    if "eviction" in by:
        g = by["eviction"]
        ms = metrics[1:]
        fig, axes = plt.subplots(1, len(ms), figsize=(3.3 * len(ms), 3.4), squeeze=False)
        for ax, (col, name) in zip(axes[0], ms, strict=True):
            lines(ax, g, "I", col)
            ax.set_ylabel(name)
            ax.set_xlabel("I")
            if col == "running_mean":
                e = g.drop_duplicates("I").sort_values("I")
                ax.plot(e["I"], e["effective_running"], color="k", ls=":", label="M/(I+O)")
        axes[0][-1].legend(fontsize=6)
        fig.suptitle("§4.3 eviction-free vs evicting (Fig. 8), O=B=1024", fontsize=10)
        save(fig, "eviction")
    if "memory" in by:
        g = by["memory"]
        mvals = sorted(set(g["M"]))
        ms = [
            ("tps", "TPS"),
            ("ttft_mean_s", "TTFT (s)"),
            ("tpot_mean_s", "TPOT (s)"),
            ("running_steady", "running size (steady)"),
            ("kv_usage_mean", "KV usage"),
        ]
        fig, axes = plt.subplots(len(ms), len(mvals), figsize=(3.0 * len(mvals), 11), squeeze=False)
        for j, m in enumerate(mvals):
            gm = g[g["M"] == m]
            for k, (col, name) in enumerate(ms):
                ax = axes[k][j]
                lines(ax, gm, "I", col)
                if col == "running_steady":
                    e = gm.drop_duplicates("I").sort_values("I")
                    ax.plot(e["I"], e["effective_running"], color="k", ls=":", label="M/(I+O)")
                ax.set_title(f"M={m:,}" if k == 0 else "", fontsize=9)
                ax.set_ylabel(name if j == 0 else "")
        axes[0][0].legend(fontsize=6)
        fig.suptitle("§4.4 M sweep (Fig. 9), O=32, B=1024", fontsize=10)
        save(fig, "memory")
    if "csp" in by or (csp is not None and len(csp)):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        if "csp" in by:
            g = by["csp"]
            lat = _pivot(g, ["I"], CSP_METRIC)
            evl = [c for c in lat.columns if not str(c).endswith("-ef")]
            efl = [c for c in lat.columns if str(c).endswith("-ef")]
            for col in ("vllm", "vllm-ef"):
                if col in lat.columns:
                    axes[0].plot(
                        lat.index,
                        lat[col],
                        marker="o",
                        ms=3,
                        label=col,
                        ls="--" if col.endswith("-ef") else "-",
                    )
            axes[0].plot(
                lat.index, lat[evl].min(axis=1), color="grey", lw=0.8, label="best evicting preset"
            )
            axes[0].plot(
                lat.index,
                lat[efl].min(axis=1),
                color="grey",
                lw=0.8,
                ls="--",
                label="best eviction-free preset",
            )
            gain = 100 * (1 - lat[evl].min(axis=1) / lat[efl].min(axis=1))
            axes[1].plot(gain.index, gain, marker="o", ms=3, label="best evicting preset")
        if csp is not None and len(csp):
            c = csp.sort_values("I")
            axes[0].plot(
                c["I"], c["optimal_latency"], color="k", marker="s", ms=4, label="CSP optimum"
            )
            gain = c["latency_gap_pct"]
            axes[1].plot(c["I"], gain, color="k", marker="s", ms=4, label="CSP optimum")
            ev = c["optimal_evictions"].fillna(0) > 0
            axes[1].scatter(
                c.loc[ev, "I"],
                gain[ev],
                s=60,
                facecolors="none",
                edgecolors="r",
                label="optimum evicts",
            )
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("I")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        axes[0].set_yscale("log")
        axes[0].set_ylabel("Σ request latency (s)")
        axes[1].axhline(0, color="k", lw=0.6)
        axes[1].axvline(128, color="r", lw=0.6, ls=":")
        axes[1].set_ylabel("latency cut vs best eviction-free (%)")
        fig.suptitle("§4.5 O=B=4, M=max(2I, I+O-1)", fontsize=10)
        save(fig, "csp")
    if "rmax" in by:
        g = by["rmax"]
        outs = sorted(set(g["O"]))
        labs = sorted(set(g["label"]))
        fig, axes = plt.subplots(
            len(outs), len(labs), figsize=(3.6 * len(labs), 3.2 * len(outs)), squeeze=False
        )
        for r, o in enumerate(outs):
            for k, lab in enumerate(labs):
                ax = axes[r][k]
                gg = g[(g["O"] == o) & (g["label"] == lab)]
                for n, (i, gi) in enumerate(gg.groupby("I")):
                    gi = gi.sort_values("R_max")
                    ax.plot(
                        gi["R_max"],
                        gi["tps"],
                        marker="o",
                        ms=3,
                        label=f"I={i}",
                        **series_style(n),
                    )
                ax.set_xscale("log", base=2)
                ax.set_title(f"{lab}, O={o}", fontsize=9)
                ax.set_xlabel("R_max")
                ax.set_ylabel("TPS")
                ax.grid(alpha=0.3)
                ax.legend(fontsize=6)
        fig.suptitle("§4.6 R_max sweep (Fig. 11)", fontsize=10)
        save(fig, "rmax")
    if "ranking" in by:
        g = by["ranking"]
        mixes = sorted(set(g["mix"]))
        ms = [
            ("latency_s", "latency (s)"),
            ("ttft_mean_s", "TTFT (s)"),
            ("tpot_mean_s", "TPOT (s)"),
        ]
        fig, axes = plt.subplots(
            len(ms), len(mixes), figsize=(3.2 * len(mixes), 8.5), squeeze=False
        )
        for j, mix in enumerate(mixes):
            for k, (col, name) in enumerate(ms):
                ax = axes[k][j]
                lines(ax, g[g["mix"] == mix], "B", col)
                ax.set_title(mix.removeprefix("infermax-") if k == 0 else "", fontsize=9)
                ax.set_ylabel(name if j == 0 else "")
                ax.set_xlabel("B" if k == len(ms) - 1 else "")
        axes[0][0].legend(fontsize=7)
        fig.suptitle("A.3 ranking by I vs O (Figs. 15-17)", fontsize=10)
        save(fig, "ranking")
    return written
