"""QLM (``papers/qlm.txt``): request groups, virtual queues, the RCT estimator, the plan
generator and the cluster-level LSOs (pull, load balancing, model warm start), as the
router/controller ``qlm``, with the pull baselines ``edf`` and ``fcfs`` and the paper's
naive-swap baselines ``fcfs-swap`` and ``edf-swap`` (``naive.py``). The per-replica
LSOs (eviction, GPU↔CPU swap) are the ``qlm`` policy (``policies/qlm/``).

Importing this package registers the routers ``qlm``, ``edf``, ``fcfs``, ``edf-swap`` and
``fcfs-swap``
(``sloserve.cluster`` imports it)."""

from contextlib import suppress
from functools import partial

from sloserve.cluster.qlm.groups import GroupingConfig, GroupKey, GroupTable, RequestGroup
from sloserve.cluster.qlm.hooks import QLMHooks, QLMStats
from sloserve.cluster.qlm.naive import NaiveSwapRouter, make_naive_swap_router
from sloserve.cluster.qlm.plan import Plan, PlanGroup, PlannerConfig, PlanQueue, generate_plan
from sloserve.cluster.qlm.rct import (
    HardwareProfile,
    OutputLengthModel,
    RCTEstimator,
    profile_instance,
    profile_replica,
)
from sloserve.cluster.qlm.router import QLMRouter, make_qlm_router
from sloserve.cluster.qlm.static import StaticBatchRouter, make_static_batch_router
from sloserve.cluster.routing import register_router
from sloserve.core.errors import ConfigError

_SUMMARIES = {
    "qlm": "QLM: request groups in per-replica virtual queues, planned by a MILP; pull, warm start",
    "edf": "global earliest-deadline-first pull from the global queue (QLM's baseline)",
    "fcfs": "global first-come-first-served pull from the global queue",
}
_NAIVE = {
    "fcfs-swap": "vLLM per-replica FCFS queues, swapping to the head's model whenever it differs",
    "edf-swap": "vLLM per-replica EDF queues, swapping to the head's model whenever it differs",
}
# Registered unless already (the module imported again). Not by asking router_names(),
# which imports every lazily registered package (Aladdin's too) to list them.
for _mode, _summary in _SUMMARIES.items():
    with suppress(ConfigError):
        register_router(_mode, partial(make_qlm_router, _mode), _summary)
for _name, _summary in _NAIVE.items():
    with suppress(ConfigError):
        register_router(_name, partial(make_naive_swap_router, _name[:-5]), _summary)
with suppress(ConfigError):
    register_router(
        "static-batch",
        make_static_batch_router,
        "SHEPHERD-like: one static batch per idle replica, planned for deadlines met",
    )

__all__ = [
    "GroupKey",
    "GroupTable",
    "GroupingConfig",
    "HardwareProfile",
    "NaiveSwapRouter",
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
    "StaticBatchRouter",
    "generate_plan",
    "make_naive_swap_router",
    "make_qlm_router",
    "make_static_batch_router",
    "profile_instance",
    "profile_replica",
]
