"""A cluster's replica lifecycle: joins (a cold start loads the model), model changes,
failures and recoveries, drains and departures.

Functions of a :class:`~sloserve.cluster.cluster.Cluster` (its public methods
``change_model``, ``fail``, ``recover`` and ``drain`` call them; its ``schedule_*`` methods
put them on the clock). The choices are the cluster module's: a failure hands every request
the replica held back to the global layer at once, a recovery starts a fresh incarnation,
a draining replica that fails leaves, and failing a failed or departed replica (or
recovering a live one) does nothing.

A load's tier: ``cpu`` when the replica holds the model in host memory (warm), else the
model's own (``disk``). One hook refines that (:class:`ReadsIntoCPU`): a controller that
reads models into a replica's CPU memory ahead of time (QLM's warm start) may say that
the model's read is already under way; the load then waits for the rest of that read and
copies the weights from CPU memory (tier ``read``) when that is quicker than a whole cold
load. Without such a controller nothing changes.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sloserve.cluster.controller import Event
from sloserve.cluster.replica import Replica
from sloserve.cluster.view import ReplicaStatus
from sloserve.core.errors import ConfigError
from sloserve.engine.env import PRIO_CONTROL

if TYPE_CHECKING:
    from sloserve.cluster.cluster import Cluster


def join(clu: Cluster, rep: Replica, first: bool = False) -> None:
    """The replica joins: at once at the start (``first``) or without cold starts, else
    after loading its model."""
    if rep.status is not ReplicaStatus.JOINING:
        return  # drained before it started
    rep.join_time = clu.env.now
    if first or not clu.cold_start:
        rep.warm_models.add(rep.spec.model)
        start(clu, rep, new_instance_id(clu, rep))
        if not first:
            clu._pull_pools(rep.spec)
    else:
        begin_load(clu, rep, rep.spec.model)


def new_instance_id(clu: Cluster, rep: Replica) -> int:
    """The instance id of the replica's next incarnation."""
    # A configured replica's first incarnation has its replica id; any other (a
    # recovery, a reload, an added replica) takes the next free id.
    if not rep.incarnations and rep.replica_id < clu._num_configured:
        return rep.replica_id
    clu._next_instance_id += 1
    return clu._next_instance_id - 1


@runtime_checkable
class ReadsIntoCPU(Protocol):
    """Extension point for a controller that reads model weights from disk into a
    replica's CPU memory ahead of a load (QLM's warm start, ``cluster/qlm/warm.py``)."""

    def read_ends_at(self, replica_id: int, model: str, now: float) -> float | None:
        """When the read of ``model`` into replica ``replica_id``'s CPU memory that has
        begun by ``now`` ends (at or before ``now``: it has ended); ``None`` when no such
        read has begun."""
        ...


def begin_load(clu: Cluster, rep: Replica, model: str) -> None:
    """The replica loads ``model`` (LOADING) and serves it once loaded."""
    assert clu.loader is not None
    old = rep.spec.model
    tier = "cpu" if model in rep.warm_models else clu.loader.tier(model)
    if model != old:
        rep.spec = clu.loader.respec(rep.spec, model)
        clu.view.moved(rep.replica_id, old)
    t = clu.loader.load_time(rep.spec, model, tier)
    ctl = clu.controller
    if tier != "cpu" and isinstance(ctl, ReadsIntoCPU):
        # the read already under way is not started again: wait for its rest, then copy
        end = ctl.read_ends_at(rep.replica_id, model, clu.env.now)
        if end is not None:
            rest = max(0.0, end - clu.env.now) + clu.loader.load_time(rep.spec, model, "cpu")
            if rest < t:
                t, tier = rest, "read"
    rep.status = ReplicaStatus.LOADING
    rep.instance = None
    rep.pending_model = None
    rep.load_token += 1
    now = clu.env.now
    rep.loads.append((now, now + t, model, tier))
    clu.env.schedule(now + t, functools.partial(loaded, clu, rep, rep.load_token), PRIO_CONTROL)


def loaded(clu: Cluster, rep: Replica, token: int) -> None:
    """A load ended: the replica serves its model (unless failed, drained or reloaded)."""
    if rep.load_token != token or rep.status is not ReplicaStatus.LOADING:
        return  # failed, drained or reloaded meanwhile
    rep.warm_models.add(rep.spec.model)
    start(clu, rep, new_instance_id(clu, rep))
    clu._pull_pools(rep.spec)


def change_model(clu: Cluster, rep: Replica, model: str) -> None:
    """Serve ``model``: stop accepting, finish what it holds, load, serve (docstring)."""
    if clu.loader is None:
        raise ConfigError("model changes need a model registry")
    if rep.status is ReplicaStatus.UP:
        if model == rep.spec.model:
            return
        if rep.holds == 0:
            begin_load(clu, rep, model)
        else:
            rep.status = ReplicaStatus.DRAINING
            rep.pending_model = model
    elif rep.status is ReplicaStatus.DRAINING and rep.pending_model is not None:
        rep.pending_model = model
    elif rep.status is ReplicaStatus.LOADING and model != rep.spec.model:
        begin_load(clu, rep, model)


def start(clu: Cluster, rep: Replica, instance_id: int) -> None:
    """A fresh engine for the replica (an incarnation), wired to the cluster; UP."""
    inst = clu._make_instance(rep.spec, instance_id)
    inst.on_done = functools.partial(clu._on_done, rep)
    clu._replica_of[instance_id] = rep
    if clu._cuts_on_arrival(inst):
        inst.next_event = clu.env.peek_control
    if rep.spec.role == "prefill":
        inst.hand_off = functools.partial(clu._hand_off, rep)
    rep.instance = inst
    rep.incarnations.append(inst)
    rep.status = ReplicaStatus.UP


def fail(clu: Cluster, rep: Replica) -> None:
    """The replica goes down; what it held is routed again (module docstring)."""
    if rep.status not in (ReplicaStatus.UP, ReplicaStatus.DRAINING, ReplicaStatus.LOADING):
        return
    rep.failures += 1
    rep.load_token += 1
    draining = rep.status is ReplicaStatus.DRAINING and rep.pending_model is None
    rep.pending_model = None
    rep.status = ReplicaStatus.LEFT if draining else ReplicaStatus.FAILED
    if rep.status is ReplicaStatus.LEFT:
        rep.leave_time = clu.env.now
    inst = rep.instance
    rep.instance = None
    ctl = clu.controller
    if ctl is not None and ctl.wants_events:
        ev = Event("failure", clu.env.now, replica=rep.replica_id)
        clu._apply(ctl.on_event(ev, clu.view))
    if inst is not None:
        clu._requeue(inst.evacuate(), rep.spec.model)
    if clu.handoff is not None:  # its KV transfers in flight are lost: from scratch
        clu._requeue(clu.handoff.lose(rep, clu.env.now), rep.spec.model)


def recover(clu: Cluster, rep: Replica) -> None:
    """A failed replica comes back empty, as a fresh incarnation."""
    if rep.status is not ReplicaStatus.FAILED:
        return
    start(clu, rep, new_instance_id(clu, rep))
    clu._pull_pools(rep.spec, soon=False)


def drain(clu: Cluster, rep: Replica) -> None:
    """Accept nothing more; leave once empty."""
    st = rep.status
    if st is ReplicaStatus.UP:
        rep.status = ReplicaStatus.DRAINING
        if rep.holds == 0:
            leave(clu, rep)
    elif st is ReplicaStatus.DRAINING:
        rep.pending_model = None  # a drain wins over a pending model change
        if rep.holds == 0:
            leave(clu, rep)
    elif st is ReplicaStatus.JOINING:
        rep.status = ReplicaStatus.LEFT
    elif st in (ReplicaStatus.FAILED, ReplicaStatus.LOADING):
        rep.load_token += 1
        leave(clu, rep)


def leave(clu: Cluster, rep: Replica) -> None:
    """The replica leaves the cluster (its GPU-seconds end here)."""
    rep.status = ReplicaStatus.LEFT
    rep.leave_time = clu.env.now
    rep.instance = None
