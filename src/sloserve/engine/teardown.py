"""How requests leave an instance before they finish there: a client's abort, the run's
horizon, a replica failure, and the hand-off of a prefill replica after the first token.

Functions of an :class:`~sloserve.engine.instance.Instance` (its methods of the same names
call them), kept beside the engine step because each must undo exactly what the step did:
an iteration in flight either completes (its tokens reach the client) or is lost, never
half-retired, and every request's KV (GPU and CPU tier) is freed once.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import numpy as np

from sloserve.core.request import Request, RequestStatus
from sloserve.engine import chunk_run
from sloserve.engine.interface import ScheduledRequest
from sloserve.metrics.summary import token_times

if TYPE_CHECKING:
    from sloserve.engine.instance import Instance

ARRIVAL_ORDER = operator.attrgetter("arrival", "req_id")
"""The order of every queue an instance keeps (FCFS, ties by id)."""


def hand_off(inst: Instance, batch: tuple[ScheduledRequest, ...], end: float) -> None:
    """A prefill replica: every request of ``batch`` that has its first token now and
    more to generate leaves (its KV freed here) for the :attr:`hand_off` callback.
    One whose client abort waits for this iteration stays, to be aborted here."""
    assert inst.hand_off is not None
    iter_end: np.ndarray | None = None
    for r, _n in batch:
        if r.status is not RequestStatus.RUNNING or not r.num_output_tokens:
            continue
        if any(a is r for a in inst._abort_after):
            continue
        if iter_end is None:
            iter_end = np.asarray(inst.iter_end, dtype=np.float64)
        inst._cont = None  # (the instance drops it too; this keeps the function self-contained)
        inst.kv.free(r.req_id)
        inst.kv.forget(r.req_id)
        inst.running.remove(r)
        inst.scheduler.on_finish(r, end)  # the policy forgets it: it left this replica
        r.hand_off(end, token_times(r, iter_end).tolist())
        inst.num_handed_off += 1
        inst.hand_off(r)


def abort(inst: Instance, req: Request) -> bool:
    """Abort one live request (its client went away) and free its KV cache.

    A request in the iteration now in flight is aborted when that iteration ends: the
    batch was priced and the GPU is busy with it either way, and retiring it half-way
    would break the token accounting. Returns False when ``req`` had already ended (or
    is not on this instance); True when it is aborted now or will be.
    """
    if req.status.is_terminal or req.instance_id != inst.instance_id:
        return False
    inst._cont = None  # a running request may leave: the engine checks the next batch whole
    pending = inst._pending
    if pending is not None and any(r is req for r, _n in pending.batch):
        if all(r is not req for r in inst._abort_after):
            inst._abort_after.append(req)
        # A final chunk not yet begun is decided at the middle run's end, as before.
        chunk_run.drop_final(pending)
        return True
    now = inst.env.now
    if req.status is RequestStatus.PREEMPTED_SWAPPED:
        inst.kv.drop_swapped(req.req_id)
        inst.swapped.remove(req)
    elif any(r is req for r in inst.incoming):
        inst.incoming.remove(req)
    else:
        inst.kv.free(req.req_id)
        (inst.running if req.status is RequestStatus.RUNNING else inst.waiting).remove(req)
    req.abort(now)
    inst._done(req)
    return True


def abort_all(inst: Instance) -> int:
    """Abort every live request (the run's horizon was reached); returns how many."""
    now = inst.env.now
    pending = inst._pending
    inst._pending = None
    if pending is not None:
        # Iterations of a fast-forwarded run that ended by now happened: deliver them,
        # as stepping one iteration at a time would have. The one in flight is lost.
        done = sum(1 for e in pending.ends if e <= now)
        if done:
            inst._retire(pending, done)
        inst.busy_time -= pending.ends[-1] - now
    live = [*inst.waiting, *inst.running, *inst.swapped, *inst.incoming]
    for r in live:
        if r.status is RequestStatus.PREEMPTED_SWAPPED:
            inst.kv.drop_swapped(r.req_id)
        else:
            inst.kv.free(r.req_id)
        r.abort(now)
        inst._done(r)
    inst.waiting.clear()
    inst.running.clear()
    inst.filling.clear()  # nothing runs: no request is filling here any more
    inst.swapped.clear()
    inst.incoming.clear()
    inst._abort_after.clear()
    inst._busy = False
    inst._cont = None
    return len(live)


def evacuate(inst: Instance) -> list[Request]:
    """The replica failed: hand back every live request, WAITING again, from scratch.

    Iterations of a fast-forwarded run that ended before now happened (their tokens
    reached the client); the iteration in flight is lost, as one stepped singly would
    be (a failure at the instant an iteration ends runs first: its event has the
    higher priority). Every request's KV (GPU and CPU tier) is freed and its client
    timeline kept (:meth:`Request.requeue_after_failure`). Requests whose abort was
    waiting for the lost iteration are aborted now. The instance is left empty and
    idle; its pending events become no-ops. Returns the requests, by arrival.
    """
    now = inst.env.now
    pending = inst._pending
    inst._pending = None
    if pending is not None:
        done = sum(1 for e in pending.ends if e < now)
        if done:
            inst._retire(pending, done)
        inst.busy_time -= pending.ends[-1] - now
    aborts = {id(r) for r in inst._abort_after}
    inst._abort_after.clear()
    live = sorted([*inst.waiting, *inst.running, *inst.swapped, *inst.incoming], key=ARRIVAL_ORDER)
    inst.waiting.clear()
    inst.running.clear()
    inst.filling.clear()  # nothing runs: no request is filling here any more
    inst.swapped.clear()
    inst.incoming.clear()
    inst._busy = False
    inst._cont = None
    iter_end = np.asarray(inst.iter_end, dtype=np.float64)
    out: list[Request] = []
    for r in live:
        if r.status is RequestStatus.PREEMPTED_SWAPPED:
            inst.kv.drop_swapped(r.req_id)
        else:
            inst.kv.free(r.req_id)
        if id(r) in aborts:
            r.abort(now)
            inst._done(r)
            continue
        inst.kv.forget(r.req_id)
        r.requeue_after_failure(now, token_times(r, iter_end).tolist())
        out.append(r)
    return out
