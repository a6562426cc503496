"""Workload statistics, plots and export as a replayable trace.

:func:`describe` summarises requests (count, span, rate over time, length percentiles,
classes, SLOs); :func:`plot_workload` draws the rate over time and the length
distributions; :func:`export_trace` writes the requests in sloserve's trace CSV format so a
workload can be replayed exactly, in simulation or against a real server.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sloserve.core.errors import WorkloadError
from sloserve.core.request import Request

if TYPE_CHECKING:  # pandas is imported by the functions that need it (start-up time)
    import pandas as pd

TRACE_COLUMNS = (
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "class",
    "priority",
    "model",
    "ttft_slo_s",
    "tpot_slo_s",
    "deadline_s",
    "qoe_ttft_s",
    "qoe_tokens_per_s",
)


def requests_frame(requests: Sequence[Request]) -> pd.DataFrame:
    """The requests as a trace table (the columns of :data:`TRACE_COLUMNS`)."""
    import pandas as pd

    def opt(v: float | None) -> float:
        return float("nan") if v is None else v

    return pd.DataFrame(
        {
            "arrival_s": [r.arrival for r in requests],
            "prompt_tokens": [r.num_prompt_tokens for r in requests],
            "output_tokens": [r.true_output_len for r in requests],
            "class": [r.req_class.value for r in requests],
            "priority": [r.priority for r in requests],
            "model": [r.model for r in requests],
            "ttft_slo_s": [opt(r.slo.ttft_s) for r in requests],
            "tpot_slo_s": [opt(r.slo.tpot_s) for r in requests],
            "deadline_s": [opt(r.slo.deadline_s) for r in requests],
            "qoe_ttft_s": [opt(r.qoe.ttft_s if r.qoe else None) for r in requests],
            "qoe_tokens_per_s": [opt(r.qoe.tokens_per_s if r.qoe else None) for r in requests],
        },
        columns=list(TRACE_COLUMNS),
    )


def _dist(v: np.ndarray) -> dict[str, float]:
    return {
        "mean": float(v.mean()),
        "std": float(v.std()),
        "min": float(v.min()),
        "p50": float(np.percentile(v, 50)),
        "p90": float(np.percentile(v, 90)),
        "p99": float(np.percentile(v, 99)),
        "max": float(v.max()),
    }


def describe(requests: Sequence[Request], *, bin_s: float | None = None) -> dict[str, Any]:
    """Statistics of a workload: counts, rate over time, length percentiles, classes."""
    if not requests:
        raise WorkloadError("the workload has no requests")
    df = requests_frame(requests)
    arr = df["arrival_s"].to_numpy(dtype=np.float64)
    span = float(arr.max() - arr.min())
    if span <= 0:  # everything at once (an offline batch): no rate to speak of
        bin_s = bin_s or 1.0
        edges = np.array([0.0])
        counts = np.array([], dtype=np.int64)
        widths_s = np.array([], dtype=np.float64)
    else:
        if bin_s is None:
            # about 20 bins, rounded to a readable width
            raw = span / 20
            widths = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
            bin_s = float(min((w for w in widths if w >= raw), default=3600))
        edges = np.arange(0.0, span + bin_s, bin_s)
        counts, _ = np.histogram(arr - arr.min(), bins=edges)
        # the last bin is cut short by the end of the workload: divide by what it covers
        widths_s = np.minimum(edges[1:], span) - edges[:-1]
        widths_s = np.where(widths_s > 0, widths_s, bin_s)
    gaps = np.diff(np.sort(arr))
    cv = float(gaps.std() / gaps.mean()) if gaps.size > 1 and gaps.mean() > 0 else None
    out: dict[str, Any] = {
        "requests": len(df),
        "span_s": span,
        "mean_rate_per_s": len(df) / span if span > 0 else None,
        "interarrival_cv": cv,
        "rate_over_time": {
            "bin_s": bin_s,
            "start_s": [float(x) for x in edges[:-1]],
            "rate_per_s": [float(c / w) for c, w in zip(counts, widths_s, strict=True)],
        },
        "prompt_tokens": _dist(df["prompt_tokens"].to_numpy(dtype=np.float64)),
        "output_tokens": _dist(df["output_tokens"].to_numpy(dtype=np.float64)),
        "total_tokens": _dist(
            (df["prompt_tokens"] + df["output_tokens"]).to_numpy(dtype=np.float64)
        ),
        "classes": {str(k): int(v) for k, v in df["class"].value_counts().sort_index().items()},
        "models": {str(k): int(v) for k, v in df["model"].value_counts().sort_index().items()},
        "slo": {
            col: (None if df[col].isna().all() else float(df[col].median()))
            for col in ("ttft_slo_s", "tpot_slo_s", "deadline_s")
        },
    }
    speeds = [r.qoe.tokens_per_s for r in requests if r.qoe is not None]
    if speeds:
        out["qoe_tokens_per_s"] = _dist(np.asarray(speeds, dtype=np.float64))
    return out


def plot_workload(
    requests: Sequence[Request], path: str | Path, *, bin_s: float | None = None
) -> Path:
    """Rate over time and prompt/output length histograms, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = describe(requests, bin_s=bin_s)
    df = requests_frame(requests)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    rot = d["rate_over_time"]
    axes[0].step(rot["start_s"], rot["rate_per_s"], where="post")
    axes[0].set_xlabel("time (s)")
    axes[0].set_ylabel(f"requests/s (bins of {rot['bin_s']:g} s)")
    for ax, col in ((axes[1], "prompt_tokens"), (axes[2], "output_tokens")):
        v = df[col].to_numpy()
        bins = np.logspace(0, math.log10(max(2, v.max())), 40) if v.max() > 1 else 10
        ax.hist(v, bins=bins)
        ax.set_xscale("log")
        ax.set_xlabel(col.replace("_", " "))
        ax.set_ylabel("requests")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def export_trace(requests: Sequence[Request], path: str | Path) -> Path:
    """Write the requests as a sloserve trace CSV (replayable with ``--trace``)."""
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # default float formatting is repr: arrival times round-trip exactly
        requests_frame(requests).to_csv(out, index=False)
    except OSError as e:
        raise WorkloadError(f"{out}: cannot write the trace ({e.strerror})") from e
    return out
