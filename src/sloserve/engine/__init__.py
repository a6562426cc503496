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


def compiled() -> bool:
    """Whether this install runs the engine's per-decision modules compiled (the opt-in
    ``SLOSERVE_COMPILE=1 pip install .`` build, docs/getting-started.md): the same
    results, and their classes cannot be subclassed or monkeypatched."""
    from importlib.machinery import EXTENSION_SUFFIXES

    from sloserve.engine import instance

    return str(instance.__file__).endswith(tuple(EXTENSION_SUFFIXES))

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
    "compiled",
]
