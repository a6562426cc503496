"""The all-reduce fit that issue 22's Vidur comparison changed: the line is fitted for the
iteration time it is part of (``fit_all_reduce(..., iteration=...)``), through
``relative_lstsq``'s per-row ``scale``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sloserve.costmodel.fit.lstsq import FloorLine, relative_lstsq
from sloserve.costmodel.fit.vidur_tables import fit_all_reduce


def test_relative_lstsq_scale_weights_each_row_by_its_own_quantity() -> None:
    rng = np.random.default_rng(3)
    x = np.column_stack([np.ones(40), rng.uniform(1, 10, 40)])
    y = 2.0 + 0.5 * x[:, 1] + rng.normal(0, 0.3, 40)
    scale = rng.uniform(1, 5, 40)
    got = relative_lstsq(x, y, [True, True], scale=scale)
    want = np.linalg.lstsq(x / scale[:, None], y / scale, rcond=None)[0]
    assert got == pytest.approx(want)
    # without scale it is the plain relative fit, which differs here
    assert not np.allclose(relative_lstsq(x, y, [True, True]), got)
    with pytest.raises(ValueError, match="scale"):
        relative_lstsq(x, y, scale=np.zeros(40))


def _floor_then_slope(bytes_per_token: int) -> pd.DataFrame:
    """A measured-like collective: flat 0.06 ms up to 512 tokens, then 5e-9 ms per byte."""
    size = np.arange(1, 8193, 8) * bytes_per_token
    knee = 512 * bytes_per_token
    t = np.where(size <= knee, 0.06, 0.06 + 5e-9 * (size - knee))
    return pd.DataFrame({"size": size.astype(np.int64), "time_ms": t})


def test_iteration_weighting_follows_the_floor_where_the_iteration_is_short() -> None:
    bpt = 16384
    measured = _floor_then_slope(bpt)
    grid = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, *range(256, 4097, 32)]
    n_ar = 161
    non_attention = FloorLine(floor=47.0, intercept=28.0, slope=0.306)  # ms per iteration
    per_msg = fit_all_reduce(measured, grid, bpt)
    per_iter = fit_all_reduce(measured, grid, bpt, iteration=(n_ar, non_attention))
    t = np.asarray(grid, dtype=np.float64)
    true = np.interp(t * bpt, measured["size"], measured["time_ms"])
    iteration = n_ar * true + non_attention(t)

    def worst_iteration_error(fit: object) -> float:
        pred = fit.predict(t * bpt)  # type: ignore[attr-defined]
        return float(np.max(np.abs(n_ar * (pred - true) / iteration)))

    decode = t <= 128
    # The per-message fit is pulled down to the slope by the many prefill sizes; the
    # iteration-weighted one stays nearer the floor at decode sizes and errs less on the
    # iteration as a whole.
    assert per_iter.intercept_ms > per_msg.intercept_ms
    err_msg = np.abs(per_msg.predict(t[decode] * bpt) - 0.06).max()
    err_iter = np.abs(per_iter.predict(t[decode] * bpt) - 0.06).max()
    assert err_iter < err_msg
    assert worst_iteration_error(per_iter) < worst_iteration_error(per_msg)
