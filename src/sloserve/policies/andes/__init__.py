"""Andes: QoE-aware token-level preemptive scheduling (Andes §4, appendices A–C), and its
QoE-aware baseline LQSF (§6.1). Paper: ``/work/shared/papers/andes.txt``.

Every scheduling decision (one per iteration while Andes is triggered), for each live
request ``i`` (running, swapped or waiting) Andes estimates

* ``Q_serve,i(B)``: its QoE (:func:`sloserve.metrics.qoe.andes_qoe`, in flight) at
  ``now + Δt`` if it is served for the next Δt in a batch of size B;
* ``Q_wait,i``: its QoE at ``now + Δt`` if it gets no token in that time;
* its context length ``l_i`` (prompt + generated tokens; the KV it occupies),

and solves the knapsack of Equation 5 (gain ``Q_serve − Q_wait``, weight = KV blocks,
capacity M, at most B items) with Algorithm 1 (greedy by ``gain / l``) or Algorithm 2 (the
3D DP, :mod:`sloserve.policies.andes.knapsack`), over a pruned range of B. The overhead-aware
refiner (§4.3) then keeps only the admissions whose QoE gain beats the QoE loss their
preemption/restart overhead inflicts on the running requests.

Modules, each with the choices it makes where the paper is vague:

* :mod:`.qoe_predict`: the QoE prediction (closed form) and the per-request QoE tracker;
* :mod:`.objectives`: the objectives of appendix A (average, max-min, perfect count);
* :mod:`.config`: :class:`AndesConfig` (Δt and the other parameters);
* :mod:`.estimate`: one decision's view of its candidates (Q_serve, the refiner's loss);
* :mod:`.packer`: admission/preemption pairs;
* :mod:`.qoe_scheduler`: what Andes and LQSF share (trigger, execution, refiner);
* :mod:`.scheduler`: Andes (batch-size search, knapsack), :func:`make_andes`;
* :mod:`.lqsf`: the LQSF baseline, :func:`make_lqsf`.
"""

from sloserve.policies.andes.config import AndesConfig, config_from_params
from sloserve.policies.andes.lqsf import LQSFConfig, LQSFScheduler, make_lqsf
from sloserve.policies.andes.objectives import (
    OBJECTIVES,
    AverageQoE,
    MaxMinQoE,
    Objective,
    ObjectiveContext,
    PerfectQoECount,
)
from sloserve.policies.andes.qoe_predict import QoETracker, predict_qoe
from sloserve.policies.andes.qoe_scheduler import QoEScheduler
from sloserve.policies.andes.scheduler import AndesScheduler, make_andes

__all__ = [
    "OBJECTIVES",
    "AndesConfig",
    "AndesScheduler",
    "AverageQoE",
    "LQSFConfig",
    "LQSFScheduler",
    "MaxMinQoE",
    "Objective",
    "ObjectiveContext",
    "PerfectQoECount",
    "QoEScheduler",
    "QoETracker",
    "config_from_params",
    "make_andes",
    "make_lqsf",
    "predict_qoe",
]
