"""The least-squares core every cost-model fit shares, and its error reports.

Relative least squares (each row of the design matrix and the target divided by the
measured value) with optional non-negativity, the ``max(floor, intercept + slope·x)`` fit of
the non-attention curve, the every-5th-point hold-out and the held-out error report. Why
these choices: :mod:`.vidur_tables` (*Operator groups and the choices made for each*) and
:mod:`.profile_fit`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

HOLDOUT_EVERY = 5
"""Every 5th point (index % 5 == 4 in input order) is held out for the error report."""


def _round(v: float, sig: int = 6) -> float:
    """``v`` to ``sig`` significant digits (keeps the YAML readable and stable)."""
    return float(f"{v:.{sig}g}")


# --------------------------------------------------------------------------- error reports


@dataclass(frozen=True)
class FitError:
    """Prediction error of one operator group on its held-out points."""

    r2: float
    median_rel_err: float
    p90_rel_err: float
    max_rel_err: float
    n_train: int
    n_test: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "r2": _round(self.r2, 4),
            "median_rel_err": _round(self.median_rel_err, 4),
            "p90_rel_err": _round(self.p90_rel_err, 4),
            "max_rel_err": _round(self.max_rel_err, 4),
            "n_train": self.n_train,
            "n_test": self.n_test,
        }


def error_report(predicted: FloatArray, measured: FloatArray, n_train: int) -> FitError:
    """R² and relative-error quantiles of ``predicted`` against ``measured``."""
    pred = np.asarray(predicted, dtype=np.float64)
    meas = np.asarray(measured, dtype=np.float64)
    if pred.shape != meas.shape or meas.size == 0:
        raise ValueError("predicted and measured must be non-empty and of the same shape")
    rel = np.abs(pred - meas) / meas
    ss_res = float(np.sum((pred - meas) ** 2))
    ss_tot = float(np.sum((meas - meas.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    return FitError(
        r2=r2,
        median_rel_err=float(np.median(rel)),
        p90_rel_err=float(np.quantile(rel, 0.9)),
        max_rel_err=float(rel.max()),
        n_train=n_train,
        n_test=int(meas.size),
    )


def holdout_mask(n: int, every: int = HOLDOUT_EVERY) -> NDArray[np.bool_]:
    """True for held-out points: every ``every``-th one (index % every == every - 1)."""
    mask: NDArray[np.bool_] = np.arange(n) % every == every - 1
    return mask


# --------------------------------------------------------------------------- least squares


def relative_lstsq(
    x: FloatArray,
    y: FloatArray,
    nonneg: Sequence[bool] | None = None,
    scale: FloatArray | None = None,
) -> FloatArray:
    """Coefficients ``c`` minimising ``Σ ((x·c − y) / y)²`` (with ``scale``:
    ``Σ ((x·c − y) / scale)²``, each row's error relative to a positive quantity of its own).

    ``nonneg[j]`` constrains ``c[j] ≥ 0``. The constrained problem is solved exactly by
    bounded-variable least squares (:func:`scipy.optimize.lsq_linear`, BVLS) on the
    row-scaled system: dropping the most negative term and refitting, as an earlier
    version did, is no bounded solver, and on nearly collinear columns it settles on a
    vertex several times worse than the optimum. Without constraints it is the plain
    (minimum-norm) least-squares solution.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError("x must be (n, k) and y (n,)")
    if np.any(y <= 0):
        raise ValueError("relative least squares needs positive targets")
    k = x.shape[1]
    cons = [False] * k if nonneg is None else list(nonneg)
    if len(cons) != k:
        raise ValueError(f"nonneg has {len(cons)} entries for {k} columns")
    if scale is None:
        w = 1.0 / y
    else:
        sc = np.asarray(scale, dtype=np.float64)
        if sc.shape != y.shape or np.any(sc <= 0):
            raise ValueError("scale must be positive, one per row")
        w = 1.0 / sc
    a, b = x * w[:, None], y * w
    sol, *_ = np.linalg.lstsq(a, b, rcond=None)
    coef: FloatArray = np.asarray(sol, dtype=np.float64)
    if not any(c and v < 0 for c, v in zip(cons, coef, strict=True)):
        # the unconstrained optimum is feasible, hence the constrained one too
        return coef
    from scipy.optimize import lsq_linear  # the fits' only scipy use: load it when needed

    lower = np.where(cons, 0.0, -np.inf)
    res = lsq_linear(a, b, bounds=(lower, np.full(k, np.inf)), method="bvls")
    out: FloatArray = np.where(cons, np.maximum(res.x, 0.0), res.x)
    return out


@dataclass(frozen=True)
class FloorLine:
    """``max(floor, intercept + slope·x)``, the shape of the non-attention curve."""

    floor: float
    intercept: float
    slope: float

    def __call__(self, x: FloatArray) -> FloatArray:
        xs = np.asarray(x, dtype=np.float64)
        return np.maximum(self.floor, self.intercept + self.slope * xs)

    @property
    def knee(self) -> float:
        """Where the line crosses the floor (0 when there is no floor)."""
        if self.slope <= 0 or self.floor <= self.intercept:
            return 0.0
        return (self.floor - self.intercept) / self.slope


def fit_floor_line(x: FloatArray, y: FloatArray) -> FloorLine:
    """Relative-least-squares fit of ``max(floor, intercept + slope·x)``.

    Every split of the points (sorted by ``x``) into a flat prefix and a linear suffix is
    tried: the prefix gets the constant, the suffix the line, each by relative least squares;
    the split whose max-form has the smallest relative squared error over all points wins.
    """
    order = np.argsort(x, kind="stable")
    xs = np.asarray(x, dtype=np.float64)[order]
    ys = np.asarray(y, dtype=np.float64)[order]
    n = xs.size
    if n < 3:
        raise ValueError("need at least 3 points to fit a floor and a line")
    best: FloorLine | None = None
    best_loss = np.inf
    for split in range(0, n - 1):
        if split:
            inv = 1.0 / ys[:split]
            floor = float(inv.sum() / np.sum(inv**2))
        else:
            floor = 0.0
        hi_x, hi_y = xs[split:], ys[split:]
        if np.ptp(hi_x) == 0:
            continue
        line = relative_lstsq(np.column_stack([np.ones_like(hi_x), hi_x]), hi_y, [False, True])
        cand = FloorLine(floor=floor, intercept=float(line[0]), slope=float(line[1]))
        loss = float(np.sum(((cand(xs) - ys) / ys) ** 2))
        if loss < best_loss:
            best, best_loss = cand, loss
    assert best is not None
    return best


# --------------------------------------------------------------------------- report values


def _clean(v: Any) -> Any:
    """Report values as plain, YAML/JSON-safe Python (NaN → None, numpy → builtins)."""
    if isinstance(v, Mapping):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, float | np.floating):
        f = float(v)
        return None if not math.isfinite(f) else f
    return v


def _metrics(pred: FloatArray, meas: FloatArray, n_train: int) -> dict[str, Any]:
    """Held-out error dict (the :class:`FitError` keys; None where there is no test point)."""
    if meas.size == 0:
        return {
            "r2": None,
            "median_rel_err": None,
            "p90_rel_err": None,
            "max_rel_err": None,
            "n_train": n_train,
            "n_test": 0,
        }
    return dict(_clean(error_report(pred, meas, n_train).as_dict()))
