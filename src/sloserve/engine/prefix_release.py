"""Queued requests give their cached prefixes back when the policy schedules nothing.

A waiting request holding cached blocks could keep a replica from running anything (its
blocks are what the running ones need): when a policy schedules no batch, the queued
requests release their prefixes and the instance asks the policy again
(``engine/prefix_cache.py``'s docstring). Re-exported by
:mod:`~sloserve.engine.prefix_cache`, where the instance calls them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sloserve.core.request import RequestStatus
from sloserve.engine.interface import SchedulerOutput

if TYPE_CHECKING:
    from sloserve.engine.instance import Instance
    from sloserve.engine.prefix_cache import PrefixCachingKVManager

_QUEUED = (RequestStatus.WAITING, RequestStatus.PREEMPTED_RECOMPUTE)


def unblock(inst: Instance, kv: PrefixCachingKVManager, out: SchedulerOutput) -> SchedulerOutput:
    """The policy's answer ``out`` had no batch (the instance calls this only then):
    ``out`` itself, or, when queued requests held cached blocks (now released,
    :func:`release_queued_prefixes`), the policy's new answer."""
    if not release_queued_prefixes(inst, kv):
        return out
    return inst.scheduler.schedule(inst.view)


def release_queued_prefixes(inst: Instance, kv: PrefixCachingKVManager) -> bool:
    """The policy scheduled no batch (nothing, or only evictions): the blocks queued
    requests hold may be what is missing (module docstring). They give them back and the
    instance asks its policy again; True when any was released."""
    released = False
    for r in reversed(inst.waiting):
        if r.status in _QUEUED and r.num_computed_tokens:
            kv.released_tokens += r.num_computed_tokens  # found, but never used
            kv._hits += (inst.env.now, 0, -r.num_computed_tokens)
            kv.free(r.req_id)
            r.num_computed_tokens = 0
            r.num_cached_tokens = 0
            released = True
    return released
