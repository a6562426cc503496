"""Report folders: data first (parquet, JSON), figures made from the data (matplotlib).

Layout of ``out/``: ``requests.parquet`` (one row per request and policy),
``trace.parquet`` (one row per scheduling decision and policy), ``summary.json``
(policy -> summary), ``config.json``, and PNG plots ``cdf_ttft.png``, ``cdf_tpot.png``,
``cdf_qoe.png`` and ``timeline.png`` (running / waiting requests and KV usage over time,
as Andes' Figure 3), and ``report.html`` (the same as one self-contained interactive page:
:mod:`sloserve.experiments.html_report`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sloserve.core.errors import ConfigError

if TYPE_CHECKING:  # pandas only where files are written: --json imports this module too
    import pandas as pd

    from sloserve.experiments.runner import RunResult

SUMMARY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("finished", "done", "{:d}"),
    ("ttft_p50", "TTFT p50 s", "{:.3f}"),
    ("ttft_p99", "TTFT p99 s", "{:.3f}"),
    ("tpot_p50", "TPOT p50 ms", "ms"),
    ("tpot_p99", "TPOT p99 ms", "ms"),
    ("e2e_mean", "E2E mean s", "{:.2f}"),
    ("qoe_mean", "QoE", "{:.3f}"),
    ("slo_attainment", "SLO att.", "{:.1%}"),
    ("throughput_tokens_per_s", "tok/s", "{:.0f}"),
    ("preemptions", "preempt", "{:d}"),
    ("prefix_hit_rate", "prefix hit", "{:.1%}"),
)


def fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if spec == "ms":
        return f"{value * 1000:.1f}"
    return spec.format(value)


def summary_rows(results: Mapping[str, RunResult]) -> list[list[str]]:
    return [
        [name, *(fmt(r.summary.get(k), f) for k, _h, f in SUMMARY_COLUMNS)]
        for name, r in results.items()
    ]


def jsonable(x: Any) -> Any:
    """``x`` as strict JSON data: numpy scalars become Python ones, NaN becomes ``null`` and
    ±inf the strings ``"inf"``/``"-inf"`` (``json.dumps`` would write non-standard
    ``NaN``/``Infinity`` that strict parsers refuse)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return jsonable(x.item())
    if isinstance(x, float):
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
    return x


_ONE = 1e-3
"""QoE within this of 1 counts as ≈ 1 (a perfect experience) on the QoE CDF."""

BOOL_COLUMNS = ("ttft_ok", "tpot_ok", "deadline_ok", "slo_ok")
"""Per-request SLO verdicts: floats in memory (1.0, 0.0, NaN: no such SLO), so that their
means are attainments; stored as nullable booleans."""


def as_stored(table: pd.DataFrame) -> pd.DataFrame:
    """The request table as written to parquet: the SLO verdicts as pandas' nullable
    ``boolean`` (``<NA>`` where the request has no such SLO) instead of 1.0/0.0/NaN."""
    out = table.copy()
    for c in BOOL_COLUMNS:
        if c in out.columns:
            out[c] = out[c].astype("boolean")
    return out


def run_info(cfg: Any, policies: Any = None) -> dict[str, Any]:
    """What a run ran: workload (trace or mix, arrivals), profile, policy (or the policies
    compared), SLOs and seed; for the top of a table and the ``"run"`` key of ``--json``."""
    w = cfg.workload
    arrival = w.arrival.model_dump(mode="json")
    slo = (
        w.slo
        if isinstance(w.slo, str)
        else {
            str(getattr(k, "value", k)): {f: v for f, v in r.model_dump().items() if v}
            for k, r in w.slo.items()
        }
    )
    return {
        "workload": w.trace if w.trace is not None else w.mix,
        "arrival": arrival,
        "duration_s": w.duration_s,
        "num_requests": w.num_requests,
        "profile": cfg.instance.profile,
        "policy": list(policies) if policies is not None else cfg.policy,
        "slo": slo,
        "seed": w.seed,
    }


def run_caption(info: Mapping[str, Any]) -> str:
    """:func:`run_info` as one line."""
    a = dict(info["arrival"])
    kind = a.pop("kind", "")
    arrival = f"{kind} " + " ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in a.items()
    )
    pol = info["policy"]
    policy = ", ".join(pol) if isinstance(pol, list) else str(pol)
    slo = info["slo"]
    if not isinstance(slo, str):
        slo = (
            "; ".join(
                f"{c} "
                + " ".join(
                    f"{k.removesuffix('_s')}<={v:g}s" if k.endswith("_s") else f"{k}={v}"
                    for k, v in rule.items()
                )
                for c, rule in slo.items()
                if rule
            )
            or "none"
        )
    window = []
    if info.get("duration_s") is not None:
        window.append(f"{info['duration_s']:g} s")
    if info.get("num_requests") is not None:
        window.append(f"<= {info['num_requests']} requests")
    return (
        f"workload {info['workload']} ({arrival.strip()}"
        + (", " + ", ".join(window) if window else "")
        + f") | profile {info['profile']} | policy {policy} | SLO {slo} | seed {info['seed']}"
    )


def write_report(results: Mapping[str, RunResult], out: str | Path, *, plots: bool = True) -> Path:
    """Write the report folder; returns its path."""
    import pandas as pd

    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{out_dir}: cannot create the report folder ({e.strerror})") from e
    tables = []
    traces = []
    for name, r in results.items():
        t = r.table.copy()
        t.insert(0, "policy", name)
        tables.append(t)
        tr = r.trace.copy()
        tr.insert(0, "policy", name)
        traces.append(tr)
    as_stored(pd.concat(tables, ignore_index=True)).to_parquet(
        out_dir / "requests.parquet", index=False
    )
    pd.concat(traces, ignore_index=True).to_parquet(out_dir / "trace.parquet", index=False)
    decisions = []
    for name, r in results.items():
        d = getattr(r, "decisions", None)  # cluster runs with trace_decisions
        if d is not None:
            d = d.copy()
            d.insert(0, "policy", name)
            decisions.append(d)
    if decisions:
        pd.concat(decisions, ignore_index=True).to_parquet(
            out_dir / "decisions.parquet", index=False
        )
    (out_dir / "summary.json").write_text(
        json.dumps(jsonable({n: r.summary for n, r in results.items()}), indent=2) + "\n"
    )
    first = next(iter(results.values()))
    (out_dir / "config.json").write_text(
        json.dumps(
            {"policies": list(results), "config": first.config.model_dump(mode="json")}, indent=2
        )
        + "\n"
    )
    if plots:
        plot_report(results, out_dir)
        from sloserve.experiments.html_report import write_html_report

        write_html_report(results, out_dir)
    return out_dir


def plot_report(results: Mapping[str, RunResult], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sloserve.experiments.plotstyle import coincident_labels, series_style

    for col, label, fname, scale in (
        ("ttft_s", "TTFT (s)", "cdf_ttft.png", 1.0),
        ("tpot_s", "TPOT (ms)", "cdf_tpot.png", 1000.0),
        ("qoe", "QoE", "cdf_qoe.png", 1.0),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        values = {
            name: np.sort(r.table[col].dropna().to_numpy(dtype=np.float64)) * scale
            for name, r in results.items()
        }
        values = {k: v for k, v in values.items() if v.size}
        labels = coincident_labels(values)
        flat = [n for n, v in values.items() if col == "qoe" and bool(np.all(v >= 1 - _ONE))]
        if values and len(flat) == len(values):
            # every request of every run at QoE ≈ 1: a CDF would be a vertical wall at 1
            lo = min(float(v[0]) for v in values.values())
            ax.text(
                0.5,
                0.5,
                f"every request's QoE ≈ 1 (lowest {lo:.4f})\nin: {', '.join(values)}",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
            ax.set_xticks([])
            ax.set_yticks([])
        else:
            for k, (name, v) in enumerate(values.items()):
                note = " (all ≈ 1)" if name in flat else ""
                ax.step(
                    v,
                    np.arange(1, v.size + 1) / v.size,
                    where="post",
                    label=labels[name] + note,
                    **series_style(k),
                )
            if col == "ttft_s":
                ax.set_xscale("symlog", linthresh=0.1)
            ax.grid(alpha=0.3)
            if values:
                ax.legend(fontsize=7)
        ax.set_xlabel(label)
        ax.set_ylabel("CDF of requests")
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)

    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    traces = {name: r.trace for name, r in results.items() if len(r.trace)}
    same = coincident_labels(
        {
            n: np.concatenate([tr["time"], tr["running"], tr["waiting"], tr["kv_usage"]])
            for n, tr in traces.items()
        }
    )
    for k, (name, tr) in enumerate(traces.items()):
        t = tr["time"].to_numpy()
        style = {"label": same[name], "lw": 0.8, **series_style(k)}
        axes[0].step(t, tr["running"], where="post", **style)
        axes[1].step(t, tr["waiting"], where="post", **style)
        axes[2].step(t, 100 * tr["kv_usage"], where="post", **style)
    axes[0].set_ylabel("running")
    axes[1].set_ylabel("waiting")
    axes[2].set_ylabel("KV usage (%)")
    axes[2].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(out_dir / "timeline.png", dpi=110)
    plt.close(fig)
