"""sloserve: SLO-aware LLM serving — simulate, compare and serve published scheduling policies.

This module is the public Python API: everything in ``__all__`` is supported and documented
(see the docs' *Python API* page). Modules below ``sloserve`` that these names do not come
from are internal and may change between releases.

>>> import sloserve
>>> result = sloserve.simulate({"workload": {"duration_s": 10}}, policy="sarathi")
>>> result.summary["policy"]
'sarathi'

Names load lazily on first use, so ``import sloserve`` is cheap and never imports the
optional heavy dependencies (FastAPI, OR-Tools, PyTorch, Ray).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it. One table, so __all__, __getattr__ and the docs agree.
_EXPORTS: dict[str, str] = {
    # running simulations
    "simulate": "sloserve.api",
    "compare": "sloserve.api",
    "load_config": "sloserve.api",
    "SimConfig": "sloserve.experiments.runner",
    "InstanceConfig": "sloserve.experiments.runner",
    "RunResult": "sloserve.experiments.runner",
    "WorkloadSpec": "sloserve.workloads.spec",
    "write_report": "sloserve.experiments.report",
    # writing a policy
    "Scheduler": "sloserve.engine.interface",
    "SchedulerOutput": "sloserve.engine.interface",
    "ScheduledRequest": "sloserve.engine.interface",
    "InstanceView": "sloserve.engine.interface",
    "Limits": "sloserve.engine.interface",
    "PreemptionMode": "sloserve.engine.interface",
    "Request": "sloserve.core.request",
    "RequestStatus": "sloserve.core.request",
    "register_policy": "sloserve.policies.registry",
    "make_policy": "sloserve.policies.registry",
    "policy_names": "sloserve.policies.registry",
    # writing a cost model / choosing hardware
    "CostModel": "sloserve.costmodel.base",
    "BatchStats": "sloserve.costmodel.base",
    "ConstantCostModel": "sloserve.costmodel.base",
    "ReplicaProfile": "sloserve.costmodel.profile",
    "load_profile": "sloserve.costmodel.profile",
    "profile_names": "sloserve.costmodel.profile",
    # clusters and routing
    "ClusterConfig": "sloserve.cluster.config",
    "Router": "sloserve.cluster.routing",
    "register_router": "sloserve.cluster.routing",
    "make_router": "sloserve.cluster.routing",
    "router_names": "sloserve.cluster.routing",
    # capacity planning
    "plan_capacity": "sloserve.experiments.capacity.run",
    "CapacityResult": "sloserve.experiments.capacity.planner",
    # the papers' reproductions, all at once, and their headline claims beside ours
    "reproduce_all": "sloserve.experiments.headline",
    # errors
    "SloserveError": "sloserve.core.errors",
    "ConfigError": "sloserve.core.errors",
    "WorkloadError": "sloserve.core.errors",
    "UnknownNameError": "sloserve.core.errors",
    "SchedulerViolation": "sloserve.core.errors",
}
# The registry's own name for it is ``register``; the public name says what it registers.
_RENAMED = {"register_policy": "register"}

__all__ = [
    "BatchStats",
    "CapacityResult",
    "ClusterConfig",
    "ConfigError",
    "ConstantCostModel",
    "CostModel",
    "InstanceConfig",
    "InstanceView",
    "Limits",
    "PreemptionMode",
    "ReplicaProfile",
    "Request",
    "RequestStatus",
    "Router",
    "RunResult",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerOutput",
    "SchedulerViolation",
    "SimConfig",
    "SloserveError",
    "UnknownNameError",
    "WorkloadError",
    "WorkloadSpec",
    "compare",
    "load_config",
    "load_profile",
    "make_policy",
    "make_router",
    "plan_capacity",
    "policy_names",
    "profile_names",
    "register_policy",
    "register_router",
    "reproduce_all",
    "router_names",
    "simulate",
    "write_report",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sloserve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _RENAMED.get(name, name))
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:  # for type checkers and the API docs; at run time names load lazily
    from sloserve.api import compare, load_config, simulate
    from sloserve.cluster.config import ClusterConfig
    from sloserve.cluster.routing import Router, make_router, register_router, router_names
    from sloserve.core.errors import (
        ConfigError,
        SchedulerViolation,
        SloserveError,
        UnknownNameError,
        WorkloadError,
    )
    from sloserve.core.request import Request, RequestStatus
    from sloserve.costmodel.base import BatchStats, ConstantCostModel, CostModel
    from sloserve.costmodel.profile import ReplicaProfile, load_profile, profile_names
    from sloserve.engine.interface import (
        InstanceView,
        Limits,
        PreemptionMode,
        ScheduledRequest,
        Scheduler,
        SchedulerOutput,
    )
    from sloserve.experiments.capacity.planner import CapacityResult
    from sloserve.experiments.capacity.run import plan_capacity
    from sloserve.experiments.headline import reproduce_all
    from sloserve.experiments.report import write_report
    from sloserve.experiments.runner import InstanceConfig, RunResult, SimConfig
    from sloserve.policies.registry import make_policy, policy_names
    from sloserve.policies.registry import register as register_policy
    from sloserve.workloads.spec import WorkloadSpec
