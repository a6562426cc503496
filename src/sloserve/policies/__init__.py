"""Per-instance scheduling policies behind one :class:`~sloserve.engine.interface.Scheduler`."""

from sloserve.policies.registry import make_policy, policy_names, policy_summaries, register
from sloserve.policies.unified import UnifiedConfig, UnifiedScheduler

__all__ = [
    "UnifiedConfig",
    "UnifiedScheduler",
    "make_policy",
    "policy_names",
    "policy_summaries",
    "register",
]
