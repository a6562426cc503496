"""InferMax's findings table (§4 and A.3 of ``papers/infermax.txt``): the paper's numbers
(:data:`~sloserve.experiments.infermax.headline.PAPER`) beside ours (the headline), as a
table and as markdown (``findings.md``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sloserve.experiments.infermax.headline import PAPER


def _fmt(v: Any, pct: bool = False, x: bool = False) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if pct:
            return f"{100 * v:.1f}%"
        if x:
            return f"{v:.2f}x"
        return f"{v:.3g}"
    return str(v)


def findings_table(head: dict[str, Any]) -> pd.DataFrame:
    """The paper's findings beside ours, one row per number (``–``: not in this run)."""
    P = PAPER
    rows: list[tuple[str, str, str, str]] = []

    def add(sec: str, what: str, paper: str, ours: str) -> None:
        rows.append((sec, what, paper, ours))

    c = head.get("contention")
    if c:
        add(
            "4.2",
            "Sarathi TPS below vLLM, up to",
            _fmt(P["sarathi_tps_below_vllm_max"], True),
            _fmt(c.get("sarathi_tps_below_vllm_max"), True),
        )
        by_o = c.get("sarathi_tpot_below_vllm_max_x_by_O") or {}
        fig5 = [v for o, v in by_o.items() if o in ("32", "1024") and v is not None]
        add(
            "4.2",
            "Sarathi TPOT below vLLM, up to",
            _fmt(P["sarathi_tpot_below_vllm_max_x"], x=True),
            _fmt(c.get("sarathi_tpot_below_vllm_max_x"), x=True)
            + (f" ({_fmt(max(fig5), x=True)} at O = 32, 1024)" if fig5 else ""),
        )
        add(
            "4.2",
            "vLLM TTFT below Sarathi (share of I×O points)",
            "lower TTFT",
            _fmt(c.get("vllm_ttft_below_sarathi_share"), True),
        )
        add(
            "4.2",
            "vLLM lowest latency, within 0.5% (share of I×O points)",
            "lowest but at high O",
            _fmt(c.get("lowest_latency_share", {}).get("vllm"), True),
        )
    e = head.get("eviction")
    if e:
        for base, pv in P["ef_tps_gain_max"].items():
            add(
                "4.3",
                f"eviction-free TPS gain over {base}, up to",
                _fmt(pv, True),
                _fmt(e["ef_tps_gain_max"].get(base), True),
            )
        for base, pv in P["ef_ttft_increase_max_x"].items():
            add(
                "4.3",
                f"eviction-free TTFT increase, {base}, up to",
                _fmt(pv, x=True),
                _fmt(e["ef_ttft_increase_max_x"].get(base), x=True),
            )
        for base, pv in P["ef_tpot_reduction_max_x"].items():
            add(
                "4.3",
                f"eviction-free TPOT reduction, {base}, up to",
                _fmt(pv, x=True),
                _fmt(e["ef_tpot_reduction_max_x"].get(base), x=True),
            )
        for key, pv in P["ef_running_size"].items():
            got = e["ef_running_size"].get(key)
            add(
                "4.3",
                f"eviction-free running size at {key}, median preset (≈ M/(I+O))",
                _fmt(pv),
                _fmt(got["measured_steady"]) + f" (M/(I+O) = {got['M/(I+O)']:.1f})" if got else "–",
            )
    m = head.get("memory")
    if m:
        for mk, per in P["evict_tps_gain_x"].items():
            for base, pv in per.items():
                add(
                    "4.4",
                    f"evicting TPS over eviction-free, {base}, {mk}, up to",
                    _fmt(pv, x=True),
                    _fmt(m["evict_tps_gain_max_x"].get(mk, {}).get(base), x=True),
                )
        for base, pv in P["evict_tps_loss_x_at_M=10000"].items():
            add(
                "4.4",
                f"eviction-free TPS over evicting, {base}, M=10000, up to",
                _fmt(pv, x=True),
                _fmt(m["evict_tps_loss_max_x"].get("M=10000", {}).get(base), x=True),
            )
        k = m.get("kv_usage_at_max_M", {})
        sar = [v for lab, v in k.items() if lab.startswith("sarathi") and isinstance(v, float)]
        add(
            "4.4",
            f"Sarathi KV usage at M={k.get('M')}",
            "< 20%",
            _fmt(max(sar), True) if sar else "–",
        )
        r = m.get("running_vs_M_over_IO")
        add(
            "4.3/4.4",
            "eviction-free running size vs M/(I+O), median (max) error",
            "≈",
            f"{_fmt(r['median_rel_error'], True)} ({_fmt(r['max_rel_error'], True)}), "
            f"{r['points']} points"
            if r
            else "–",
        )
    s = head.get("csp")
    if s:
        sol = s.get("solver") or {}
        note = head.get("csp_note", "–")
        evicts = sol.get("optimum_evicts_at_I") or []
        add(
            "4.5",
            "optimum evicts at I (solved)",
            "I < 128",
            ", ".join(map(str, evicts)) or "none" if sol else note,
        )
        add(
            "4.5",
            "optimum does not evict from I",
            "128",
            _fmt(sol.get("crossover_I")) if sol else note,
        )
        add(
            "4.5",
            "optimum vs best eviction-free schedule, cut up to",
            _fmt(P["csp_evict_latency_cut_max"], True),
            _fmt(sol.get("evict_cut_max"), True),
        )
        add(
            "4.5",
            "optimum (no evictions) vs vLLM (evicting), I ≥ 128, cut up to",
            _fmt(P["csp_ef_latency_cut_max"], True),
            _fmt(sol.get("optimum_vs_vllm_cut_max_large_I"), True),
        )
        if "eviction_cost_max_large_I" in sol:
            add(
                "4.5",
                "best evicting schedule vs eviction-free optimum, I ≥ 128, cost up to",
                _fmt(P["csp_ef_latency_cut_max"], True),
                _fmt(sol["eviction_cost_max_large_I"], True),
            )
        if sol.get("preset_beats_solver_at_I"):
            add(
                "4.5",
                "a preset beats the solver's schedule at I (not optimal)",
                "–",
                ", ".join(map(str, sol["preset_beats_solver_at_I"])),
            )
        if sol.get("not_optimal_at_I"):
            add(
                "4.5",
                "CSP not proven optimal at I (time limit)",
                "–",
                ", ".join(map(str, sol["not_optimal_at_I"])) + f" (max gap "
                f"{_fmt(sol.get('max_gap'), True)})",
            )
        add(
            "4.5",
            "vLLM (evicting) vs vLLM-ef, I < 128, cut up to",
            _fmt(P["csp_evict_latency_cut_max"], True) + " (CSP)",
            _fmt(s.get("vllm_evict_cut_max_small_I"), True),
        )
        add(
            "4.5",
            "vLLM-ef vs vLLM (evicting), I ≥ 128, cut up to",
            _fmt(P["csp_ef_latency_cut_max"], True),
            _fmt(s.get("vllm_ef_cut_max_large_I"), True),
        )
        wins = s.get("vllm_evicting_wins_at_I")
        add(
            "4.5",
            "vLLM (evicting) beats vLLM-ef at I",
            "I < 128",
            ", ".join(map(str, wins)) if wins is not None else "–",
        )
    rm = head.get("rmax")
    if rm:
        for key, v in rm.items():
            o = key.split("/")[0]
            paper = str(P["rmax_best_O=1024"]) if o == "O=1024" else "increasing"
            add(
                "4.6",
                f"best R_max (mean TPS), {key}",
                paper,
                f"{v['best_R_max_mean_tps']}" + (" (increasing)" if v["tps_increasing"] else ""),
            )
    rk = head.get("ranking")
    if rk:
        for key, pk, what in (
            ("latency_x", "rank_input_latency_x", "latency"),
            ("ttft_x", "rank_input_ttft_x", "TTFT"),
        ):
            for other, pv in P[pk].items():
                got = rk.get(key, {}).get(other)
                add(
                    "A.3",
                    f"Rank_I {what} below {other}, up to",
                    _fmt(pv, x=True),
                    (_fmt(got["max"], x=True) + f" ({got['where']})") if got else "–",
                )
    return pd.DataFrame(rows, columns=["section", "finding", "paper", "ours"])


def findings_markdown(findings: pd.DataFrame, head: dict[str, Any]) -> str:
    lines = ["| § | finding | paper | ours |", "|---|---|---|---|"]
    for r in findings.itertuples(index=False):
        lines.append(f"| {r.section} | {r.finding} | {r.paper} | {r.ours} |")
    if head.get("csp_note"):
        lines.append("")
        lines.append(f"Note: {head['csp_note']}")
    return "\n".join(lines) + "\n"
