"""The simulation engine: event kernel, replica instance, KV cache managers."""

from sloserve.engine.env import Environment
from sloserve.engine.instance import Instance
from sloserve.engine.interface import (
    InstanceView,
    Limits,
    PreemptionMode,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)
from sloserve.engine.kv import KVCacheManager, PagedKVManager

__all__ = [
    "Environment",
    "Instance",
    "InstanceView",
    "KVCacheManager",
    "Limits",
    "PagedKVManager",
    "PreemptionMode",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerOutput",
]
