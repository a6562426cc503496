"""The planner's files and figures, and the plan chosen for export.

Folder layout (``--out``): ``answers.csv`` (one row per answer), ``probes.csv`` (every
simulation), ``capacity.json`` (settings, checks, the chosen plan, timings),
``explain.md`` (why each answer is the answer), ``gpus_vs_rate.png`` (fewest GPUs against
the rate, one line per router + policy, a panel per profile and layout),
``pareto.png`` (every fully simulated configuration's cost against its attainment, with
the Pareto front), and ``deploy/`` (``vllm-serve.sh``, ``values.yaml``) for the chosen plan.

**The chosen plan**: at the highest rate asked, the passing answer with the lowest cost per
hour (GPU count when a profile has no price), ties broken by the higher attainment; for a
fixed cluster, the router + policy with the highest sustained rate.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from sloserve.experiments.capacity.explain import explain_rows
from sloserve.experiments.capacity.export import replica_kinds, serve_script, values_file
from sloserve.experiments.capacity.planner import CapacityResult
from sloserve.experiments.capacity.space import Arm, groups, parse_layout


def chosen(result: CapacityResult) -> dict[str, Any] | None:
    """The answer row to deploy (see the module docstring), or None when none passes."""
    a = result.answers
    if result.question == "max-rate":
        ok = a[a["max_rate"].notna()]
        if not len(ok):
            return None
        return dict(ok.sort_values("max_rate", ascending=False, kind="stable").iloc[0])
    ok = a[a["replicas"].notna()]
    if not len(ok):
        return None
    top = ok[ok["rate"] == ok["rate"].max()].copy()
    cost = pd.to_numeric(top.get("usd_per_hour"), errors="coerce")
    top["_cost"] = cost.fillna(math.inf) if cost.notna().all() else top["gpus"].astype(float)
    top = top.sort_values(["_cost", "attainment"], ascending=[True, False], kind="stable")
    return dict(top.drop(columns="_cost").iloc[0])


def plan_cluster(row: Mapping[str, Any], prices: Mapping[str, float | None]) -> dict[str, Any]:
    """The ``cluster:`` mapping of a fewest-GPUs answer row."""
    arm = Arm(
        str(row["profile"]),
        str(row["router"]),
        str(row["policy"]),
        parse_layout("agg" if row["layout"] == "agg" else "pd:" + str(row["layout"])[2:]),
    )
    return {"replicas": groups(arm, int(row["replicas"]), prices), "router": arm.router}


def gpus_figure(answers: pd.DataFrame, path: Path) -> Path | None:
    """Fewest GPUs against the rate: a line per router + policy, a panel per profile and
    layout (a rate with no answer is left out of its line)."""
    if not len(answers) or answers["gpus"].notna().sum() == 0:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from sloserve.experiments.plotstyle import series_style

    panels = list(dict.fromkeys(zip(answers["profile"], answers["layout"], strict=True)))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 3.6), squeeze=False)
    for ax, (prof, lay) in zip(axes[0], panels, strict=True):
        d = answers[(answers["profile"] == prof) & (answers["layout"] == lay)]
        for k, ((router, policy), g) in enumerate(d.groupby(["router", "policy"], sort=False)):
            g = g.sort_values("rate")
            none = [f"{r:g}" for r, n in zip(g["rate"], g["gpus"], strict=True) if pd.isna(n)]
            label = f"{router} + {policy}" + (f" (none meets at {', '.join(none)})" if none else "")
            ax.plot(g["rate"], g["gpus"], marker="o", label=label, **series_style(k))
        ax.set_title(f"{Path(str(prof)).stem} ({lay})", fontsize=9)
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel("fewest GPUs meeting the SLO")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pareto_figure(probes: pd.DataFrame, path: Path) -> Path | None:
    """Cost (USD per hour, else GPUs) against attainment over the fully simulated probes
    (the mean over seeds of each configuration), with the Pareto front."""
    from sloserve.experiments.pareto import plot_pareto

    full = probes[probes["stopped_at_s"].isna()] if len(probes) else probes
    if not len(full):
        return None
    keys = ["profile", "router", "policy", "layout", "replicas", "rate"]
    agg = full.groupby(keys, sort=False, dropna=False).agg(
        attainment=("attainment", "min"),
        gpus=("gpus", "first"),
        cost_usd=("cost_usd", "mean"),
    )
    agg = agg.reset_index()
    # the simulated run's cost when every profile has a price, else the GPU count
    x = "cost_usd" if agg["cost_usd"].notna().all() else "gpus"
    agg["config"] = agg["router"] + " + " + agg["policy"]
    written, _ = plot_pareto(agg, ((x, "min"), ("attainment", "max")), path, ["config"])
    return written


def write(
    result: CapacityResult,
    out: str | Path,
    base: Mapping[str, Any],
    *,
    fixed_cluster: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write every file of the folder layout; returns ``capacity.json``'s content."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result.answers.to_csv(out / "answers.csv", index=False)
    result.probes.to_csv(out / "probes.csv", index=False)
    plan = chosen(result)
    prices = result.settings.get("prices", {})
    files = ["answers.csv", "probes.csv", "capacity.json", "explain.md"]
    exported: dict[str, Any] | None = None
    if plan is not None:
        if result.question == "max-rate":
            cluster = {**dict(fixed_cluster or {}), "router": plan["router"]}
            title = f"{plan['router']} + {plan['policy']}: sustains {plan['max_rate']:g} req/s"
        else:
            cluster = plan_cluster(plan, prices)
            title = (
                f"{plan['profile']} | {plan['router']} | {plan['policy']} | {plan['layout']}: "
                f"{int(plan['replicas'])} replicas ({int(plan['gpus'])} GPUs) "
                f"for {plan['rate']:g} req/s"
            )
        kinds = replica_kinds(base, cluster, str(plan["policy"]))
        (out / "deploy").mkdir(exist_ok=True)
        (out / "deploy" / "vllm-serve.sh").write_text(serve_script(kinds, title))
        (out / "deploy" / "values.yaml").write_text(values_file(kinds, title))
        files += ["deploy/vllm-serve.sh", "deploy/values.yaml"]
        exported = {"title": title, "cluster": cluster, "commands": [k.command() for k in kinds]}
    bullets = explain_rows(result.answers, result.question)
    (out / "explain.md").write_text("# Why each answer\n\n" + "\n".join(bullets) + "\n")
    if result.question == "fewest-gpus" and gpus_figure(result.answers, out / "gpus_vs_rate.png"):
        files.append("gpus_vs_rate.png")
    if pareto_figure(result.probes, out / "pareto.png"):
        files.append("pareto.png")
    info = {
        "question": result.question,
        "settings": result.settings,
        "checks": result.checks,
        "monotone": not result.checks,
        "plan": exported,
        "simulations": result.simulations,
        "rounds": result.rounds,
        "configurations": result.configurations,
        "wall_s": result.wall_s,
        "files": files,
    }
    from sloserve.experiments.report import jsonable

    (out / "capacity.json").write_text(json.dumps(jsonable(info), indent=2))
    return info
