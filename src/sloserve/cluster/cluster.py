"""The cluster: many replicas on one clock, a router, a global queue, joins/drains/faults.

Events, not scans. Each :class:`~sloserve.engine.instance.Instance` schedules its own
iterations on the shared :class:`~sloserve.engine.env.Environment`; an idle one schedules
nothing. The cluster acts only on its own events — an arrival (route it now), a request
ending (bookkeeping; a pull from the global queue if it holds requests of that model), a
join, drain, failure or recovery — and never loops over all replicas; only the router
scores the replicas of the request's model.

Choices:

- Routing happens inside the arrival event: a one-replica ``pass-through`` cluster
  replays the single-replica run's events exactly.
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
  request counts and KV usage (``reads_kv_only``) and a KV manager that can shrink,
  that is the next control event (a fault, join, drain, the horizon): neither arrivals
  nor other replicas' iterations cut its runs; a request routed to it mid-run cuts the
  run at that instant instead (:meth:`Instance.interrupt`), exactly where a run planned
  to stop there would have ended. So an event costs the replica it reaches, not every
  replica. With other routers every event cuts every run, so that what a router reads
  is what it read before. The per-decision timeline is coarser (fewer, longer samples),
  which moves ``scheduling_decisions`` and the sampled KV-usage mean, not the requests.
- Disaggregated prefill/decode: ``handoff.py`` (held hand-offs wait in ``<model>/decode``).
- Joins, model loads, failures, recoveries and drains: ``lifecycle.py``.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from sloserve.cluster import lifecycle
from sloserve.cluster.admission import Admission, AlwaysAdmit
from sloserve.cluster.controller import (
    Action,
    AddReplica,
    ChangeModel,
    Controller,
    Event,
    RemoveReplica,
    ReorderQueue,
    Requeue,
    Reroute,
)
from sloserve.cluster.handoff import KVHandoff, TransferTime, pools, queue_key
from sloserve.cluster.replica import InstanceFactory, Replica, ReplicaSpec, SimReplicaView
from sloserve.cluster.routing import Hold, Router, route_explained
from sloserve.cluster.view import ClusterView, ReplicaStatus, RouteRequest
from sloserve.core.errors import ConfigError, SloserveError
from sloserve.core.request import Request, RequestStatus
from sloserve.engine.env import PRIO_ARRIVAL, PRIO_CONTROL, Environment
from sloserve.engine.instance import Instance


class ConservationError(SloserveError, RuntimeError):
    """A request ended twice, or was left neither ended nor held (a cluster bug)."""


def _key(r: Request) -> tuple[int, float, int]:
    # Priority first (lower is served first): with the default 0 this is arrival order.
    return (r.priority, r.arrival, r.req_id)


class ModelLoader(Protocol):
    """How the cluster prices and applies a model load (``cluster/models.py`` behind it)."""

    def load_time(self, spec: ReplicaSpec, model: str, tier: str) -> float: ...
    def respec(self, spec: ReplicaSpec, model: str) -> ReplicaSpec:
        """The replica's spec once it serves ``model`` (its profile for that model)."""
        ...

    def tier(self, model: str) -> str:
        """Where ``model``'s weights are for a replica that has not held them yet."""
        ...


class Cluster:
    """Replicas of ``specs`` on ``env``, requests routed by ``router``.

    Optional parts: ``loader`` (model loads: cold starts when ``cold_start``, model changes),
    ``admission`` (before routing; default: admit all), ``controller`` (ticks and events,
    actions applied here), ``trace_decisions`` (every routing decision in
    :attr:`decisions`), ``servable`` (models requests may name beyond the replicas' own),
    ``kv_transfer`` and ``decode_router`` (prefill/decode roles: ``handoff.py``).
    """

    def __init__(
        self,
        env: Environment,
        specs: Sequence[ReplicaSpec],
        make_instance: InstanceFactory,
        router: Router,
        *,
        loader: ModelLoader | None = None,
        cold_start: bool = True,
        admission: Admission | None = None,
        controller: Controller | None = None,
        trace_decisions: bool = False,
        servable: Iterable[str] = (),
        kv_transfer: TransferTime | None = None,
        decode_router: Router | None = None,
    ) -> None:
        self.env = env
        self.router = router
        self._make_instance = make_instance
        self.loader = loader
        self.cold_start = cold_start and loader is not None
        self.admission: Admission = admission or AlwaysAdmit()
        self.controller = controller
        self.replicas = [Replica(s) for s in specs]
        if [r.replica_id for r in self.replicas] != list(range(len(specs))):
            raise ConfigError("replica ids must be 0..N-1 in order")
        self._group_spec: dict[int, ReplicaSpec] = {}
        for s in specs:
            self._group_spec.setdefault(s.group, s)
        self.view = ClusterView((SimReplicaView(r) for r in self.replicas), lambda: env.now)
        self.handoff = KVHandoff.of(self.replicas, kv_transfer, lambda: env.now)
        self.decode_router = decode_router or router
        self.models = frozenset({*(s.model for s in specs), *servable})
        self.rejected: Counter[str] = Counter()
        """Admission rejections by reason."""
        self.decisions: list[dict[str, Any]] | None = [] if trace_decisions else None
        """Routing records (``trace_decisions``): one per routing attempt."""
        self._queued_since: dict[int, float] = {}
        self.pending_arrivals: Callable[[], bool] = lambda: False
        """Whether arrivals are still to come (keeps controller ticks going)."""
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
        self._num_configured = len(specs)
        self._pull_pending: set[str] = set()
        self._replica_of: dict[int, Replica] = {}
        """The replica of each instance (incarnation) id."""
        for r in self.replicas:
            if r.spec.start_s <= env.now:
                lifecycle.join(self, r, first=True)
            else:
                join = functools.partial(lifecycle.join, self, r)
                env.schedule(r.spec.start_s, join, PRIO_CONTROL)

    # ------------------------------------------------------------------ lifecycle
    # (``lifecycle.py``: joins, model loads, failures, recoveries, drains.)
    def change_model(self, rep: Replica, model: str) -> None:
        """Serve ``model``: stop accepting, finish what it holds, load, serve."""
        lifecycle.change_model(self, rep, model)

    def fail(self, rep: Replica) -> None:
        """The replica goes down; what it held is routed again (module docstring)."""
        lifecycle.fail(self, rep)

    def recover(self, rep: Replica) -> None:
        """A failed replica comes back empty, as a fresh incarnation."""
        lifecycle.recover(self, rep)

    def drain(self, rep: Replica) -> None:
        """Accept nothing more; leave once empty."""
        lifecycle.drain(self, rep)

    def schedule_model_swap(self, replica: int, at_s: float, model: str) -> None:
        rep = self.replicas[replica]
        self.env.schedule(at_s, functools.partial(self.change_model, rep, model), PRIO_CONTROL)

    def schedule_failure(self, replica: int, at_s: float, recover_s: float | None) -> None:
        rep = self.replicas[replica]
        self.env.schedule(at_s, functools.partial(self.fail, rep), PRIO_CONTROL)
        if recover_s is not None:
            self.env.schedule(recover_s, functools.partial(self.recover, rep), PRIO_CONTROL)

    def schedule_drain(self, replica: int, at_s: float) -> None:
        self.env.schedule(at_s, functools.partial(self.drain, self.replicas[replica]), PRIO_CONTROL)

    def _requeue(self, evacuated: list[Request], model: str) -> None:
        """Requests a replica gave back (a failure, a re-queue action) join the global
        queue in order and are pulled at once."""
        if evacuated:
            q = self.queue.setdefault(model, [])
            for r in evacuated:
                bisect.insort(q, r, key=_key)
                self._queued_since[r.req_id] = self.env.now
            self._pull(model)

    def _cuts_on_arrival(self, inst: Instance) -> bool:
        """Whether ``inst`` runs past arrivals and is cut when one reaches it (module
        docstring, fast path)."""
        return (not self.router.reads_progress or self.router.reads_kv_only) and inst.kv.can_shrink

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
        ctl = self.controller
        if ctl is not None and ctl.wants_events:
            self._apply(ctl.on_event(Event("arrival", self.env.now, req_id=req.req_id), self.view))
        verdict = self.admission.admit(req, self)  # ``live`` does not count the arrival yet
        self.submitted += 1
        if not verdict.admitted:
            self._reject(req, verdict.reason)
            return
        if verdict.displace is not None:
            gone = verdict.displace
            self.queue[gone.model].remove(gone)
            self._queued_since.pop(gone.req_id, None)
            self._reject(gone, "shed_displaced")
        self._route_or_queue(req, model)

    def _route_or_queue(self, req: Request, model: str) -> None:
        """Route ``req``, or queue it behind the held requests of its queue ``model``."""
        q = self.queue.get(model)
        if q:
            bisect.insort(q, req, key=_key)
            self._queued_since[req.req_id] = self.env.now
            self._pull(model)
        else:
            self._route(req)

    # AdmissionContext
    @property
    def now(self) -> float:
        return self.env.now

    @property
    def live(self) -> int:
        return self.submitted - len(self.ended)

    def queued(self) -> Iterable[Request]:
        for q in self.queue.values():
            yield from q

    def _reject(self, req: Request, reason: str) -> None:
        req.reject(self.env.now, reason)
        self.rejected[reason] += 1
        self._end(req)

    def _end(self, req: Request) -> None:
        if req.req_id in self.ended:
            raise ConservationError(f"request {req.req_id} ended twice")
        self.ended[req.req_id] = req
        if self.on_done is not None:
            self.on_done(req)

    def _route(self, req: Request) -> bool:
        """Route one request; False (and queued) when the router holds it."""
        rr = RouteRequest.of(req)
        ho = self.handoff
        prefilled = ho is not None and req.num_output_tokens > 0
        router = self.decode_router if prefilled else self.router
        view = self.view if ho is None else ho.view_for(req)
        if self.decisions is None:
            d = router.route(rr, view)
        else:
            d = self._route_traced(req, rr, router, view)
        if isinstance(d, Hold):
            self.holds[d.reason] += 1
            bisect.insort(self.queue.setdefault(queue_key(req), []), req, key=_key)
            self._queued_since.setdefault(req.req_id, self.env.now)
            return False
        self._queued_since.pop(req.req_id, None)
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
        if prefilled:
            inst.add_prefilled(req)
        else:
            inst.add_request(req)
        return True

    def _hand_off(self, rep: Replica, req: Request) -> None:
        """A prefill replica let ``req`` go after its first token: its KV moves now."""
        assert self.handoff is not None
        end = self.handoff.start(rep, req, self.env.now)
        self.env.schedule(end, functools.partial(self._transferred, req, end), PRIO_ARRIVAL)
        if self.queue:
            self._pull_pools(rep.spec)

    def _transferred(self, req: Request, end: float) -> None:
        if self.handoff is not None and self.handoff.done(req, end):
            self._route_or_queue(req, queue_key(req))

    def abort(self, req: Request) -> bool:
        """End a live request because its client went away (the live gateway): out of the
        global queue if it is held there, else on its replica (at the end of the iteration
        in flight if it is in it, :meth:`Instance.abort`). False when it already ended."""
        if req.status.is_terminal:
            return False
        q = self.queue.get(queue_key(req)) or []
        k = next((i for i, r in enumerate(q) if r is req), None)
        if k is not None or (self.handoff is not None and self.handoff.drop(req)):
            if k is not None:
                del q[k]
            req.abort(self.env.now)
            self.abort_reasons[req.req_id] = "client"
            self._end(req)
            return True
        rep = self._replica_of.get(req.instance_id)
        inst = None if rep is None else rep.instance
        return inst is not None and inst.abort(req)

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

    def _pull_pools(self, spec: ReplicaSpec, soon: bool = True) -> None:
        """A replica of ``spec`` has room: pull its model's queue and the ``default`` one."""
        for key in pools(spec):
            (self._pull_soon if soon else self._pull)(key)

    def _pull_event(self, model: str) -> None:
        self._pull_pending.discard(model)
        self._pull(model)

    def _route_traced(
        self, req: Request, rr: RouteRequest, router: Router, view: ClusterView
    ) -> int | Hold:
        now = self.env.now
        d, rec = route_explained(router, rr, view)
        since = self._queued_since.get(req.req_id, now)
        rec.update({"time": now, "queue_s": now - since, "class": req.req_class.value})
        assert self.decisions is not None
        self.decisions.append(rec)
        return d

    def _on_done(self, rep: Replica, req: Request) -> None:
        if req.req_id in self.ended:
            raise ConservationError(f"request {req.req_id} ended twice")
        self.ended[req.req_id] = req
        if req.status is RequestStatus.FINISHED:
            rep.served += 1
        elif req.status is RequestStatus.ABORTED:
            self.abort_reasons[req.req_id] = self._abort_reason
        if rep.status is ReplicaStatus.DRAINING and rep.holds == 0:
            if rep.pending_model is not None:
                lifecycle.begin_load(self, rep, rep.pending_model)
            else:
                lifecycle.leave(self, rep)
        ctl = self.controller
        if ctl is not None and ctl.wants_events:
            acts = ctl.on_event(Event("finish", self.env.now, req_id=req.req_id), self.view)
            if any(isinstance(a, Requeue) and a.replica == rep.replica_id for a in acts):
                # This finish comes from inside the replica's own batch retire: evacuating
                # it now would pull the batch from under that loop. Carry the actions out,
                # in order, at this same instant once the retire has ended.
                self.env.schedule(self.env.now, functools.partial(self._apply, acts), PRIO_CONTROL)
            else:
                self._apply(acts)
        if self.queue:
            self._pull_pools(rep.spec)
            if req.model == "default":
                for m in self.queue:
                    self._pull_soon(m)
        if self.on_done is not None:
            self.on_done(req)

    _abort_reason = "client"
    """Why an instance aborted a request: its client (before close), else the close's."""

    # ------------------------------------------------------------------ controller
    def start_controller(self) -> None:
        """Schedule the controller's first tick (``tick_s`` from now)."""
        ctl = self.controller
        if ctl is not None and ctl.tick_s is not None:
            self.env.schedule(self.env.now + ctl.tick_s, self._tick, PRIO_CONTROL)

    def _tick(self) -> None:
        ctl = self.controller
        assert ctl is not None and ctl.tick_s is not None
        queued = {m: len(q) for m, q in self.queue.items() if q}
        self._apply(ctl.on_tick(self.env.now, self.view, queued))
        # Tick only while there is something to control: an idle, finished cluster stops.
        if self.live > 0 or self.pending_arrivals():
            self.env.schedule(self.env.now + ctl.tick_s, self._tick, PRIO_CONTROL)

    def _apply(self, actions: Sequence[Action]) -> None:
        """Carry out a controller's actions, in order (``cluster/controller.py``)."""
        for a in actions:
            if isinstance(a, AddReplica):
                self.add_replica(a.group)
            elif isinstance(a, RemoveReplica):
                self.drain(self._replica(a.replica))
            elif isinstance(a, ChangeModel):
                self.change_model(self._replica(a.replica), a.model)
            elif isinstance(a, Requeue):
                rep = self._replica(a.replica)
                if rep.instance is not None and rep.holds:
                    self._requeue(rep.instance.evacuate(), rep.spec.model)
            elif isinstance(a, Reroute):
                moved = self._replica(a.replica).withdraw_unstarted(a.req_id)
                if moved is not None:
                    self._route_or_queue(moved, queue_key(moved))
            elif isinstance(a, ReorderQueue):
                q = self.queue.get(a.model, [])
                ids = set(a.req_ids)
                front = {r.req_id: r for r in q if r.req_id in ids}
                q[:] = [front[i] for i in a.req_ids if i in front] + [
                    r for r in q if r.req_id not in ids
                ]
                if front:  # a new front may be routable where the old one was held
                    self._pull_soon(a.model)
            else:
                raise ConfigError(f"unknown controller action {a!r}")

    def _replica(self, replica_id: int) -> Replica:
        if not 0 <= replica_id < len(self.replicas):
            raise ConfigError(f"controller action names replica {replica_id}, which is not there")
        return self.replicas[replica_id]

    def add_replica(self, group: int) -> Replica:
        """A new replica of ``group`` joins now (a cold start when ``cold_start``)."""
        base = self._group_spec.get(group)
        if base is None:
            raise ConfigError(f"controller action names replica group {group}, which is not there")
        spec = dataclasses.replace(base, replica_id=len(self.replicas), start_s=self.env.now)
        rep = Replica(spec)
        self.replicas.append(rep)
        self.view.add(SimReplicaView(rep))
        lifecycle.join(self, rep)
        return rep

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
        for r in self.handoff.take_all() if self.handoff is not None else ():
            self.queue.setdefault(queue_key(r), []).append(r)  # aborted below
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
