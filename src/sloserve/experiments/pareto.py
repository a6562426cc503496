"""The Pareto front of a sweep's two metrics, and its plot.

An axis is a metric name with a direction, ``name:max`` or ``name:min``; without one,
names that measure something good (attainment, throughput, goodput, QoE, finished
requests) are maximised and every other metric (latencies, cost, preemptions) minimised.
A point is on the front when no other point is at least as good on both axes and better
on one. Rows where either metric is missing are never on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from sloserve.core.errors import ConfigError

Axis = tuple[str, str]
"""(metric column, ``"max"`` or ``"min"``)."""

DEFAULT_AXES: tuple[Axis, Axis] = (("throughput_requests_per_s", "max"), ("ttft_attainment", "max"))
_GOOD = ("attainment", "throughput", "goodput", "qoe", "finished")


def _axis(raw: str) -> Axis:
    name, _, way = raw.strip().partition(":")
    name = name.strip()
    if not name:
        raise ConfigError(f"--pareto: empty metric name in {raw!r}")
    if way:
        if way not in ("min", "max"):
            raise ConfigError(f"--pareto: {raw!r}: the direction must be min or max")
        return name, way
    return name, "max" if any(g in name for g in _GOOD) else "min"


def parse_axes(spec: str | Sequence[str] | None) -> tuple[Axis, Axis]:
    """``"x,y"`` (or two names) → two axes; ``None``: :data:`DEFAULT_AXES`."""
    if spec is None:
        return DEFAULT_AXES
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    if len(parts) != 2:
        raise ConfigError(f"--pareto: expected two metrics 'x,y', got {spec!r}")
    return _axis(parts[0]), _axis(parts[1])


def _values(table: pd.DataFrame, axis: Axis) -> np.ndarray:
    name, way = axis
    if name not in table.columns:
        metrics = [c for c in table.columns if pd.api.types.is_numeric_dtype(table[c])]
        raise ConfigError(
            f"--pareto: no metric {name!r} in the sweep's summary; numeric columns: "
            f"{', '.join(metrics[:40])}"
        )
    v = pd.to_numeric(table[name], errors="coerce").to_numpy(dtype=np.float64)
    return v if way == "max" else -v  # larger is better from here on


def pareto_mask(table: pd.DataFrame, axes: tuple[Axis, Axis]) -> np.ndarray:
    """True for the rows on the front (both axes turned into 'larger is better')."""
    if len(table) == 0:
        return np.zeros(0, dtype=bool)
    x, y = _values(table, axes[0]), _values(table, axes[1])
    ok = np.isfinite(x) & np.isfinite(y)
    front = np.zeros(len(table), dtype=bool)
    for i in np.flatnonzero(ok):
        ge = ok & (x >= x[i]) & (y >= y[i])
        gt = (x > x[i]) | (y > y[i])
        front[i] = not np.any(ge & gt)
    return front


def plot_pareto(
    table: pd.DataFrame, axes: tuple[Axis, Axis], path: Path, params: list[str] | None
) -> tuple[Path | None, str]:
    """Scatter every point, coloured by the first parameter, and draw the front; the path
    written (None when nothing could be plotted) and a note saying why not."""
    if len(table) == 0:
        return None, "no finished point to plot"
    x, y = _values(table, axes[0]), _values(table, axes[1])
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.any():
        return None, f"{axes[0][0]} or {axes[1][0]} is undefined at every point: no plot"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = pd.to_numeric(table[axes[0][0]], errors="coerce")
    ys = pd.to_numeric(table[axes[1][0]], errors="coerce")
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    by = params[0] if params else None
    if by is not None and by in table.columns:
        groups = table[by].astype(str)
        markers = "osD^v<>Px*"
        for n, g in enumerate(dict.fromkeys(groups)):
            m = (groups == g).to_numpy() & ok
            ax.scatter(xs[m], ys[m], s=22, marker=markers[n % len(markers)], label=f"{by}={g}")
        ax.legend(fontsize=8)
    else:
        ax.scatter(xs[ok], ys[ok], s=22)
    front = pareto_mask(table, axes)
    order = np.argsort(xs[front].to_numpy(), kind="stable")
    ax.plot(
        xs[front].to_numpy()[order],
        ys[front].to_numpy()[order],
        color="black",
        linewidth=1.2,
        label="Pareto front",
    )
    ax.set_xlabel(f"{axes[0][0]} ({'higher' if axes[0][1] == 'max' else 'lower'} is better)")
    ax.set_ylabel(f"{axes[1][0]} ({'higher' if axes[1][1] == 'max' else 'lower'} is better)")
    ax.set_title(f"{int(ok.sum())} points, {int(front.sum())} on the Pareto front")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, ""
