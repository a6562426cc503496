"""A preemption livelock turned into an error instead of a run that never ends.

Under memory pressure a policy may preempt requests that are re-admitted and preempted
again with none of them ever finishing: two requests whose prompts barely fit the KV
cache evicting each other by recompute at every decision, or, with prefix caching, a
requeued request keeping its cached prefix pinned while it waits, so that preempting it
frees less than the policy counted (reproduced on tiny caches: thousands of preemptions,
neither request finishing; without a horizon the simulation never ends and its memory
grows). Progress is any request leaving the replica (``Instance.done`` grows). After
:data:`LIMIT` decisions that preempt with no request leaving, the instance raises
:class:`~sloserve.core.errors.StallError` naming the policy, the instant and the cache,
as it does when a policy schedules nothing with nothing left to wait for.

Counted only where a decision preempts (nothing on any other decision), so a run that
preempts and progresses is untouched: any finish, abort or hand-off resets the count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sloserve.core.errors import StallError

if TYPE_CHECKING:
    from sloserve.engine.instance import Instance

LIMIT = 10_000
"""Decisions that preempt on one replica with no request leaving it before the run is
called a livelock (a thrashing run that still finishes requests never gets near it).
Decisions, not preempted requests: a policy that evicts many at once (BROS's swaps)
counts once per decision."""


def preempted(inst: Instance) -> None:
    """Count a decision that preempts (called only for those); raise
    :class:`StallError` at :data:`LIMIT` of them with no request leaving since."""
    done = len(inst.done)
    if done != inst._thrash_done:  # a request left since the last preemption: progress
        inst._thrash_done = done
        inst._thrash = 0
        inst._thrash_since = inst.env.now
    inst._thrash += 1
    if inst._thrash >= LIMIT:
        kv = inst.kv
        raise StallError(
            f"policy {inst.scheduler.name!r} preempted requests at {inst._thrash} decisions "
            f"between t={inst._thrash_since:.3f}s and t={inst.env.now:.3f}s with no request "
            f"finishing (a preemption livelock: {len(inst.running)} running, "
            f"{len(inst.waiting)} waiting; KV cache {kv.num_blocks} blocks of "
            f"{kv.block_size} tokens, too small for the requests it admits; a larger cache "
            "or a horizon ends it)"
        )
