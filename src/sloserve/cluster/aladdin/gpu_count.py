"""Aladdin §5.2: the analytic worker count ``N_w = ⌈k5·r_a + c5⌉`` for ``r_a > R``.

``k5`` and ``c5`` are fitted by least squares to (arrival rate, workers needed) pairs from
placement runs; :func:`predict_workers` applies Eq. 7. The pairs' source is the caller's:
the reproduction (``experiments/aladdin``) finds the fewest workers meeting the SLOs by
simulation at each rate. Choice: ``R`` is the smallest rate fitted (below it the paper's
linear law is not claimed) and the prediction there is at least one worker.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sloserve.core.errors import ConfigError


@dataclass(frozen=True)
class WorkerLaw:
    """Eq. 7's coefficients, the rate it holds above, and its largest miss on the fit."""

    k5: float
    c5: float
    r_min: float
    max_miss: int

    def predict(self, rate: float) -> int:
        """``⌈k5·rate + c5⌉`` (at least one); raises for a rate below ``r_min``."""
        if rate < self.r_min:
            raise ConfigError(f"rate: {rate:g} is below R = {self.r_min:g}, where Eq. 7 holds")
        return max(1, math.ceil(self.k5 * rate + self.c5 - 1e-9))


def fit_worker_law(rates: Sequence[float], workers: Sequence[int]) -> WorkerLaw:
    """Least squares of ``workers ≈ k5·rate + c5`` (needs two distinct rates)."""
    r = np.asarray(rates, dtype=np.float64)
    w = np.asarray(workers, dtype=np.float64)
    if len(r) != len(w) or len(np.unique(r)) < 2:
        raise ConfigError("worker law: needs (rate, workers) pairs at two or more rates")
    (k5, c5), *_ = np.linalg.lstsq(np.column_stack([r, np.ones_like(r)]), w, rcond=None)
    law = WorkerLaw(float(k5), float(c5), float(r.min()), 0)
    miss = max(abs(law.predict(float(x)) - int(y)) for x, y in zip(r, w, strict=True))
    return WorkerLaw(law.k5, law.c5, law.r_min, miss)
