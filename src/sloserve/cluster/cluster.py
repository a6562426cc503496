"""The cluster: many replicas on one clock, a router, a global queue, joins/drains/faults.

Events, not scans. Each :class:`~sloserve.engine.instance.Instance` schedules its own
iterations on the shared :class:`~sloserve.engine.env.Environment`; an idle one schedules
nothing. The cluster acts only on its own events — an arrival (route it now), a request
ending (bookkeeping; a pull from the global queue if it holds requests of that model), a
join, drain, failure or recovery — and never loops over all replicas; only the router
scores the replicas of the request's model.

Choices:

- Routing happens inside the arrival event, so that a one-replica cluster with the
  ``pass-through`` router replays exactly the single-replica run's events.
- The global queue is per model and ordered by (arrival, id), failed-over requests keeping
  their arrival. An arrival joins the queue's tail if that model already has held requests.
  A pull retries the queue in order and stops at the first request the router holds
  again (FIFO, no overtaking). Pulls are events at the instant room frees (a request ends,
  a replica joins or recovers), scheduled once per model per instant, so no engine
  callback re-enters routing.
- A failure evacuates the replica (:meth:`Instance.evacuate`): every request it held goes
  back to the global layer and is routed again at once, served from scratch elsewhere. A
  recovery starts a fresh incarnation of the replica. A draining replica that fails leaves.
  Failing a failed or departed replica, or recovering a live one, does nothing.
- Every submitted request ends exactly once (finished, rejected or aborted): the cluster
  raises on a second end, and :meth:`Cluster.close` checks that none is left live.
  Requests still held when the run closes are aborted with a reason: ``horizon`` at the
  run's horizon, ``no_replica`` when the run ran out of events with nothing to serve them.
- Fast path (speed only, the same requests' results): an instance fast-forwards a
  repeatable batch up to the next event that can change it. With a router that reads only
  request counts (:attr:`Router.reads_progress` false) and a KV manager that can shrink,
  that is the next control event (a fault, join, drain, the horizon): neither arrivals
  nor other replicas' iterations cut its runs; a request routed to it mid-run cuts the
  run at that instant instead (:meth:`Instance.interrupt`), exactly where a run planned
  to stop there would have ended. So an event costs the replica it reaches, not every
  replica. With other routers every event cuts every run, so that what a router reads
  is what it read before. The per-decision timeline is coarser (fewer, longer samples),
  which moves ``scheduling_decisions`` and the KV-usage mean sampled from it, not the
  requests.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections import Counter
from collections.abc import Callable, Sequence

from sloserve.cluster.replica import InstanceFactory, Replica, ReplicaSpec, SimReplicaView
from sloserve.cluster.routing import Hold, Router
from sloserve.cluster.view import ClusterView, ReplicaStatus, RouteRequest
from sloserve.core.errors import ConfigError, SloserveError
from sloserve.core.request import Request, RequestStatus
from sloserve.engine.env import PRIO_CONTROL, Environment
from sloserve.engine.instance import Instance


class ConservationError(SloserveError, RuntimeError):
    """A request ended twice, or was left neither ended nor held (a cluster bug)."""


def _key(r: Request) -> tuple[float, int]:
    return (r.arrival, r.req_id)


class Cluster:
    """Replicas of ``specs`` on ``env``, requests routed by ``router``."""

    def __init__(
        self,
        env: Environment,
        specs: Sequence[ReplicaSpec],
        make_instance: InstanceFactory,
        router: Router,
    ) -> None:
        self.env = env
        self.router = router
        self._make_instance = make_instance
        self.replicas = [Replica(s) for s in specs]
        if [r.replica_id for r in self.replicas] != list(range(len(specs))):
            raise ConfigError("replica ids must be 0..N-1 in order")
        self.view = ClusterView((SimReplicaView(r) for r in self.replicas), lambda: env.now)
        self.models = frozenset(s.model for s in specs)
        self.on_done: Callable[[Request], None] | None = None
        """Called after the cluster's bookkeeping each time a request ends (batch jobs)."""
        self.queue: dict[str, list[Request]] = {}
        """The global queue, per model, by (arrival, id)."""
        self.holds: Counter[str] = Counter()
        """Hold decisions by reason."""
        self.abort_reasons: dict[int, str] = {}
        self.ended: dict[int, Request] = {}
        self.submitted = 0
        self._next_instance_id = len(specs)
        self._pull_pending: set[str] = set()
        for r in self.replicas:
            if r.spec.start_s <= env.now:
                self._join(r, first=True)
            else:
                env.schedule(r.spec.start_s, functools.partial(self._join, r), PRIO_CONTROL)

    # ------------------------------------------------------------------ lifecycle
    def _join(self, rep: Replica, first: bool = False) -> None:
        if rep.status is not ReplicaStatus.JOINING:
            return  # drained before it started
        rep.join_time = self.env.now
        self._start(rep, rep.replica_id)
        if not first:
            self._pull_soon(rep.spec.model)

    def _start(self, rep: Replica, instance_id: int) -> None:
        inst = self._make_instance(rep.spec, instance_id)
        inst.on_done = functools.partial(self._on_done, rep)
        if self._cuts_on_arrival(inst):
            inst.next_event = self.env.peek_control
        rep.instance = inst
        rep.incarnations.append(inst)
        rep.status = ReplicaStatus.UP

    def schedule_failure(self, replica: int, at_s: float, recover_s: float | None) -> None:
        rep = self.replicas[replica]
        self.env.schedule(at_s, functools.partial(self.fail, rep), PRIO_CONTROL)
        if recover_s is not None:
            self.env.schedule(recover_s, functools.partial(self.recover, rep), PRIO_CONTROL)

    def schedule_drain(self, replica: int, at_s: float) -> None:
        self.env.schedule(at_s, functools.partial(self.drain, self.replicas[replica]), PRIO_CONTROL)

    def fail(self, rep: Replica) -> None:
        """The replica goes down; what it held is routed again (module docstring)."""
        if rep.status not in (ReplicaStatus.UP, ReplicaStatus.DRAINING):
            return
        rep.failures += 1
        rep.status = (
            ReplicaStatus.LEFT if rep.status is ReplicaStatus.DRAINING else ReplicaStatus.FAILED
        )
        if rep.status is ReplicaStatus.LEFT:
            rep.leave_time = self.env.now
        inst = rep.instance
        assert inst is not None
        evacuated = inst.evacuate()
        rep.instance = None
        if evacuated:
            q = self.queue.setdefault(rep.spec.model, [])
            for r in evacuated:
                bisect.insort(q, r, key=_key)
            self._pull(rep.spec.model)

    def recover(self, rep: Replica) -> None:
        """A failed replica comes back empty, as a fresh incarnation."""
        if rep.status is not ReplicaStatus.FAILED:
            return
        self._start(rep, self._next_instance_id)
        self._next_instance_id += 1
        self._pull(rep.spec.model)

    def drain(self, rep: Replica) -> None:
        """Accept nothing more; leave once empty."""
        st = rep.status
        if st is ReplicaStatus.UP:
            rep.status = ReplicaStatus.DRAINING
            if rep.holds == 0:
                self._leave(rep)
        elif st is ReplicaStatus.JOINING:
            rep.status = ReplicaStatus.LEFT
        elif st is ReplicaStatus.FAILED:
            self._leave(rep)

    def _leave(self, rep: Replica) -> None:
        rep.status = ReplicaStatus.LEFT
        rep.leave_time = self.env.now
        rep.instance = None

    def _cuts_on_arrival(self, inst: Instance) -> bool:
        """Whether ``inst`` runs past arrivals and is cut when one reaches it (module
        docstring, fast path)."""
        return not self.router.reads_progress and inst.kv.can_shrink

    # ------------------------------------------------------------------ requests
    def add_request(self, req: Request) -> None:
        """A request arrives now: route it, or hold it in the global queue."""
        model = req.model
        if model not in self.models and model != "default":
            raise ConfigError(
                f"request {req.req_id}: model {model!r} is served by no replica "
                f"(served: {', '.join(sorted(self.models))})"
            )
        if req.req_id in self.ended:
            raise ConservationError(f"request {req.req_id} submitted after it ended")
        self.submitted += 1
        q = self.queue.get(model)
        if q:
            bisect.insort(q, req, key=_key)
            self._pull(model)
        else:
            self._route(req)

    def _route(self, req: Request) -> bool:
        """Route one request; False (and queued) when the router holds it."""
        d = self.router.route(RouteRequest.of(req), self.view)
        if isinstance(d, Hold):
            self.holds[d.reason] += 1
            bisect.insort(self.queue.setdefault(req.model, []), req, key=_key)
            return False
        rep = self.replicas[d]
        if rep.status is not ReplicaStatus.UP or (
            req.model != "default" and rep.spec.model != req.model
        ):
            raise ConfigError(
                f"router {self.router.name!r} sent request {req.req_id} (model {req.model!r}) "
                f"to replica {d} ({rep.status.value}, model {rep.spec.model!r})"
            )
        inst = rep.instance
        assert inst is not None
        if self._cuts_on_arrival(inst):
            inst.interrupt()
        inst.add_request(req)
        return True

    def _pull(self, model: str) -> None:
        """Hand held requests of ``model`` out, in order, until the router holds one."""
        q = self.queue.get(model)
        while q:
            req = q.pop(0)
            if not self._route(req):
                # _route put it back in its place; stop (no overtaking)
                return

    def _pull_soon(self, model: str) -> None:
        if self.queue.get(model) and model not in self._pull_pending:
            self._pull_pending.add(model)
            self.env.schedule(self.env.now, functools.partial(self._pull_event, model))

    def _pull_event(self, model: str) -> None:
        self._pull_pending.discard(model)
        self._pull(model)

    def _on_done(self, rep: Replica, req: Request) -> None:
        if req.req_id in self.ended:
            raise ConservationError(f"request {req.req_id} ended twice")
        self.ended[req.req_id] = req
        if req.status is RequestStatus.FINISHED:
            rep.served += 1
        elif req.status is RequestStatus.ABORTED:
            self.abort_reasons[req.req_id] = self._abort_reason
        if rep.status is ReplicaStatus.DRAINING and rep.holds == 0:
            self._leave(rep)
        if self.queue:
            self._pull_soon(rep.spec.model)
            if req.model == "default":
                for m in self.queue:
                    self._pull_soon(m)
        if self.on_done is not None:
            self.on_done(req)

    _abort_reason = "client"
    """Why an instance aborted a request: its client (before close), else the close's."""

    # ------------------------------------------------------------------ the end
    def close(self, horizon: float) -> bool:
        """End the run at ``env.now``: abort what is left (reasons in :attr:`abort_reasons`)
        and check conservation. Returns True when anything was still live."""
        now = self.env.now
        left = False
        reason = "horizon" if math.isfinite(horizon) else "no_replica"
        self._abort_reason = reason
        for rep in self.replicas:
            inst = rep.instance
            if inst is not None and (inst.num_live > 0 or inst.busy):
                left = True
                inst.abort_all()
        for model in sorted(self.queue):
            for r in self.queue[model]:
                left = True
                r.abort(now)
                self.abort_reasons[r.req_id] = reason
                if r.req_id in self.ended:
                    raise ConservationError(f"request {r.req_id} ended twice")
                self.ended[r.req_id] = r
                if self.on_done is not None:
                    self.on_done(r)
            self.queue[model].clear()
        if len(self.ended) != self.submitted:
            raise ConservationError(f"{self.submitted} requests submitted, {len(self.ended)} ended")
        live = [r.req_id for r in self.ended.values() if not r.status.is_terminal]
        if live:
            raise ConservationError(f"requests {live[:5]} counted as ended but still live")
        return left
