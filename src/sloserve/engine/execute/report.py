"""Measured vs predicted iteration times of an execute-mode run.

The relative error of an iteration is ``|predicted - measured| / measured``; the report
gives its median and 90th percentile per batch kind (prefill, decode, hybrid) and over
all iterations, with the median measured and predicted times.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sloserve.engine.execute.torch_executor import IterationRecord


def timing_report(records: Sequence[IterationRecord]) -> dict[str, Any]:
    """``{kind: {iterations, median_rel_err, p90_rel_err, median_measured_s,
    median_predicted_s}}`` for each kind present and ``all``."""
    out: dict[str, Any] = {}
    groups: dict[str, list[IterationRecord]] = {"all": list(records)}
    for r in records:
        groups.setdefault(r.kind, []).append(r)
    for kind, rs in groups.items():
        if not rs:
            continue
        meas = np.array([r.measured_s for r in rs])
        pred = np.array([r.predicted_s for r in rs])
        err = np.abs(pred - meas) / meas
        out[kind] = {
            "iterations": len(rs),
            "median_rel_err": float(np.median(err)),
            "p90_rel_err": float(np.percentile(err, 90)),
            "median_measured_s": float(np.median(meas)),
            "median_predicted_s": float(np.median(pred)),
        }
    return out
