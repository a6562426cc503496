"""Andes' scheduling objectives (Andes appendix A): value functions of predicted QoE whose
difference is a request's knapsack gain.

Choice where the paper is vague:

* **Objectives** (appendix A) are value functions ``v(Q)`` with gain
  ``v(Q_serve) − v(Q_wait)``: average QoE ``v(Q) = Q``; max-min ``v(Q) = −max(Q_min − Q,
  0)`` (``Q_min`` = the lowest current QoE among live requests; the gain equals Equation 7
  whenever serving keeps the request at or above ``Q_min``); perfect-QoE count
  ``v(Q) = 1(Q = 1)·1(Q_now = 1)`` (Equation 8).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sloserve.policies.andes.qoe_predict import EPS, FloatArray


@dataclass(frozen=True)
class ObjectiveContext:
    """What a gain function may need besides the predicted QoE."""

    q_now: FloatArray
    """Each candidate's current (in-flight) QoE."""
    q_min: float
    """The lowest current QoE among the live requests (1 when there are none)."""


class Objective(Protocol):
    """A scheduling objective (Andes appendix A) as a value function of predicted QoE:
    a request's knapsack gain is ``value(Q_serve) − value(Q_wait)``."""

    name: str
    needs_current: bool
    """Whether :meth:`value` reads ``ctx.q_now`` / ``ctx.q_min`` (they cost a pass)."""

    def value(self, q: FloatArray, ctx: ObjectiveContext) -> FloatArray: ...


class AverageQoE:
    """Maximise the average QoE (Equation 5): gain = Q_serve − Q_wait."""

    name = "avg"
    needs_current = False

    def value(self, q: FloatArray, ctx: ObjectiveContext) -> FloatArray:
        return q


class MaxMinQoE:
    """Maximise the minimum QoE (Equation 7): gain = max(Q_min − Q_wait, 0) when serving
    keeps the request at or above Q_min."""

    name = "max-min"
    needs_current = True

    def value(self, q: FloatArray, ctx: ObjectiveContext) -> FloatArray:
        return -np.maximum(ctx.q_min - q, 0.0)


class PerfectQoECount:
    """Maximise the number of requests with perfect QoE (Equation 8)."""

    name = "perfect"
    needs_current = True

    def value(self, q: FloatArray, ctx: ObjectiveContext) -> FloatArray:
        perfect_now = ctx.q_now >= 1.0 - EPS
        return ((q >= 1.0 - EPS) & perfect_now).astype(np.float64)


OBJECTIVES: dict[str, Callable[[], Objective]] = {
    "avg": AverageQoE,
    "max-min": MaxMinQoE,
    "perfect": PerfectQoECount,
}
OBJECTIVE_ALIASES = {"average": "avg", "maxmin": "max-min", "min": "max-min"}
