"""QLM's figures and tables from the reproduction's data: attainment and throughput by
system (Fig. 10/13), the LSO ablations, the group-size trade-off and the plan-generator
time curve (§8.3)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sloserve.experiments.qlm.plan import BASELINES


def system_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean attainment (all, rt, be), throughput and model loads per workload and system."""
    main = main_grid(results)
    cols = [
        "attainment",
        "attainment_rt",
        "attainment_be",
        "throughput_tokens_per_s",
        "model_loads_cold",
        "model_loads_warm",
        "model_loads_read",
        "preemptions",
        "plan_calls",
    ]
    order = {s: k for k, s in enumerate(["qlm", *BASELINES])}
    t = main.groupby(["workload", "system"], sort=True)[cols].mean().reset_index()
    t["_o"] = [order.get(s, 99) for s in t["system"]]
    return t.sort_values(["workload", "_o", "system"]).drop(columns="_o").reset_index(drop=True)


def main_grid(results: pd.DataFrame) -> pd.DataFrame:
    """The systems grid: the ``main`` runs at the default group size, Poisson arrivals."""
    return results[
        (results["sweep"] == "main")
        & (results["group_size_factor"] == 4.0)
        & (results["arrival_cv"] == 1.0)
    ]


SWEEP_KNOB = {
    "queue": "rate",
    "tail": "tail_share",
    "a10": "a10_share",
    "mega": "mega_share",
    "large": "tail_share",
}
"""Each §8.3 sweep's x-axis column."""


def sweep_table(results: pd.DataFrame) -> pd.DataFrame:
    """The §8.3 sweeps, one row per (sweep, knob value, system): attainment (all, rt),
    throughput, preemptions. W_B's main-grid point joins the queue sweep as its first rate
    and W_A's as the tail sweep's 0.3."""
    parts = []
    main = main_grid(results)
    for sweep, knob in SWEEP_KNOB.items():
        s = results[results["sweep"] == sweep]
        if s.empty:
            continue
        base = {"queue": "W_B", "tail": "W_A"}.get(sweep)
        if base is not None:
            extra = main[(main["workload"] == base) & main["system"].isin(set(s["system"]))]
            s = pd.concat([extra, s])
        t = s.groupby([knob, "system"])[
            ["attainment", "attainment_rt", "throughput_tokens_per_s", "preemptions"]
        ].mean()
        t = t.reset_index().rename(columns={knob: "x"})
        t.insert(0, "sweep", sweep)
        parts.append(t)
    cols = ["sweep", "x", "system", "attainment", "attainment_rt", "throughput_tokens_per_s"]
    if not parts:
        return pd.DataFrame(columns=[*cols, "preemptions"])
    return pd.concat(parts, ignore_index=True)


def group_size_table(results: pd.DataFrame) -> pd.DataFrame:
    """QLM on W_B per group-size factor: attainment, plan calls and solve time."""
    g = results[
        (results["workload"] == "W_B")
        & (results["system"] == "qlm")
        & (results["arrival_cv"] == 1.0)
        & (results["sweep"] == "main")
    ]
    return (
        g.groupby("group_size_factor")[["attainment", "plan_calls", "plan_solve_s"]]
        .mean()
        .reset_index()
    )


def burst_table(results: pd.DataFrame) -> pd.DataFrame:
    """W_B by burstiness (inter-arrival CV) and system: attainment, rt attainment and
    throughput (the systems of the burst sweep only)."""
    mid = results[
        (results["workload"] == "W_B")
        & (results["group_size_factor"] == 4.0)
        & (results["sweep"] == "main")
    ]
    mid = mid[mid["system"].isin(["qlm", "edf", "fcfs-swap"])]
    cols = ["attainment", "attainment_rt", "throughput_tokens_per_s"]
    return mid.groupby(["arrival_cv", "system"])[cols].mean().reset_index()


def plot(results: pd.DataFrame, plan_times: pd.DataFrame, out_dir: Path) -> None:
    """``attainment.png`` (attainment and throughput by system and workload),
    ``plan_time.png`` (solve time vs queue size) and ``sweeps.png`` (attainment along each
    §8.3 sweep)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = system_table(results)
    wls = sorted(set(t["workload"]))
    fig, axes = plt.subplots(2, len(wls), figsize=(4.2 * len(wls), 5.6), squeeze=False)
    for j, wl in enumerate(wls):
        s = t[t["workload"] == wl]
        for i, (col, label) in enumerate(
            (("attainment", "deadline attainment"), ("throughput_tokens_per_s", "tokens/s"))
        ):
            ax = axes[i][j]
            ax.bar(range(len(s)), s[col], color=["C0" if x == "qlm" else "C7" for x in s["system"]])
            ax.set_xticks(range(len(s)), list(s["system"]), rotation=40, ha="right", fontsize=7)
            ax.set_ylabel(label)
            if i == 0:
                ax.set_title(wl)
    fig.tight_layout()
    fig.savefig(out_dir / "attainment.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(4.2, 3.0))
    ax.plot(plan_times["requests"], plan_times["solve_s"], marker="o")
    ax.set_xscale("log")
    ax.set_xlabel("queued requests")
    ax.set_ylabel("plan time (s)")
    fig.tight_layout()
    fig.savefig(out_dir / "plan_time.png", dpi=110)
    plt.close(fig)
    sw = sweep_table(results)
    names = list(dict.fromkeys(sw["sweep"]))
    if not names:
        return
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.2), squeeze=False)
    for j, name in enumerate(names):
        ax = axes[0][j]
        for system, d in sw[sw["sweep"] == name].groupby("system"):
            ax.plot(d["x"], d["attainment"], marker="o", label=str(system))
        ax.set_xlabel(SWEEP_KNOB[name])
        ax.set_ylabel("deadline attainment")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out_dir / "sweeps.png", dpi=110)
    plt.close(fig)
