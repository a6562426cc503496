"""QLM (``papers/qlm.txt``): request groups, virtual queues, the RCT estimator, the plan
generator and the cluster-level LSOs (pull, load balancing, model warm start), as the
router/controller ``qlm``, with the pull baselines ``edf`` and ``fcfs``. The per-replica
LSOs (eviction, GPU↔CPU swap) are the ``qlm`` policy (``policies/qlm/``).

Importing this package registers the routers ``qlm``, ``edf`` and ``fcfs``
(``sloserve.cluster`` imports it)."""

from functools import partial

from sloserve.cluster.qlm.groups import GroupingConfig, GroupKey, GroupTable, RequestGroup
from sloserve.cluster.qlm.hooks import QLMHooks, QLMStats
from sloserve.cluster.qlm.plan import Plan, PlanGroup, PlannerConfig, PlanQueue, generate_plan
from sloserve.cluster.qlm.rct import (
    HardwareProfile,
    OutputLengthModel,
    RCTEstimator,
    profile_instance,
    profile_replica,
)
from sloserve.cluster.qlm.router import QLMRouter, make_qlm_router
from sloserve.cluster.routing import register_router, router_names

_SUMMARIES = {
    "qlm": "QLM: request groups in per-replica virtual queues, planned by a MILP; pull, warm start",
    "edf": "global earliest-deadline-first pull from the global queue (QLM's baseline)",
    "fcfs": "global first-come-first-served pull from the global queue",
}
for _mode, _summary in _SUMMARIES.items():
    if _mode not in router_names():
        register_router(_mode, partial(make_qlm_router, _mode), _summary)

__all__ = [
    "GroupKey",
    "GroupTable",
    "GroupingConfig",
    "HardwareProfile",
    "OutputLengthModel",
    "Plan",
    "PlanGroup",
    "PlanQueue",
    "PlannerConfig",
    "QLMHooks",
    "QLMRouter",
    "QLMStats",
    "RCTEstimator",
    "RequestGroup",
    "generate_plan",
    "make_qlm_router",
    "profile_instance",
    "profile_replica",
]
