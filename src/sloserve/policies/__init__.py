"""Per-instance scheduling policies behind one :class:`~sloserve.engine.interface.Scheduler`."""

from sloserve.policies.infermax.unified import UnifiedConfig, UnifiedScheduler
from sloserve.policies.registry import make_policy, policy_names, policy_summaries, register

__all__ = [
    "UnifiedConfig",
    "UnifiedScheduler",
    "make_policy",
    "policy_names",
    "policy_summaries",
    "register",
]
