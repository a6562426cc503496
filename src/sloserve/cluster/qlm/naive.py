"""QLM's §8 baselines as the paper runs them: vLLM with per-instance queues (FCFS or EDF)
and **naive model swapping** — the routers ``fcfs-swap`` and ``edf-swap``.

Each arriving request joins the queue of one replica, in rotation over the live replicas
(vLLM behind a round-robin balancer), and stays there. A replica serves its own queue in
order (arrival for ``fcfs-swap``, absolute deadline for ``edf-swap``) and only its head:
a request is pulled when it is the head of its replica's queue, the replica serves its
model and has room. Whenever the head is of another model the replica changes to it at
once (the cluster's :class:`ChangeModel`: it finishes what it holds, then loads, cold from
disk — these baselines keep nothing warm in CPU memory). Under multi-model load the heads
alternate between models and the replica thrashes, which is what QLM's Insight #3 avoids.

``assign`` (router parameter): ``rotation`` (default) puts every request on the next live
replica regardless of its model; ``model`` rotates over the live replicas that serve its
model (or are changing to it) and only over all of them when none does — a vLLM
deployment where each frequent model has its instances and only a tail model's requests
make an instance swap (§8's W_A: "tail models ... only occasionally need to be swapped
in"). The paper does not say how its baselines assign requests to instances; both are run.

Choices where the paper is vague: "whenever that differs" is read literally (no wait for
the replica to go idle, unlike ``edf``/``fcfs``, which change a model only when idle); a
request whose replica failed joins the next live replica's queue; requests of model
``default`` (a single-model run) never cause a change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sloserve.cluster.controller import Action, Event, ReorderQueue
from sloserve.cluster.qlm.changes import change
from sloserve.cluster.qlm.router import QLMRouter, make_qlm_router
from sloserve.cluster.routing import Decision, Hold
from sloserve.cluster.view import ClusterView, ReplicaStatus, RouteRequest
from sloserve.core.errors import ConfigError

_KEEPS_QUEUE = (
    ReplicaStatus.UP,
    ReplicaStatus.LOADING,
    ReplicaStatus.DRAINING,
    ReplicaStatus.JOINING,
)
"""Statuses a replica's queue survives; any other (failed, removed) re-homes it."""
_ASSIGN = ("rotation", "model")


class NaiveSwapRouter(QLMRouter):
    """``fcfs-swap`` / ``edf-swap``: per-replica queues, head-of-line pull, a model change
    whenever the head's model differs (module docstring)."""

    def __init__(self, base: QLMRouter, order: str, assign: str = "rotation") -> None:
        # Reuse the pull/hold bookkeeping of the QLM baselines (held and dispatched
        # requests, model-change tracking, stats); no groups and no plan are used.
        self.__dict__.update(base.__dict__)
        self.order = order
        self.name = f"{order}-swap"
        self.assign = assign
        self._home: dict[int | str, int] = {}
        self._rotation = -1

    def _key(self, r: RouteRequest) -> tuple[float, float]:
        return (self._deadline(r) if self.order == "edf" else r.arrival, r.arrival)

    def _usable(self, view: ClusterView, rid: int) -> bool:
        return view.replica(rid).status in _KEEPS_QUEUE

    def _home_of(self, r: RouteRequest, view: ClusterView) -> int | None:
        rid = self._home.get(r.req_id)
        if rid is not None and self._usable(view, rid):
            return rid
        live = self._live(view)
        if not live:
            return None
        if self.assign == "model":
            same = [
                v for v in live if r.model in (v.model, self._changing.get(v.replica_id), "default")
            ]
            live = same or live
        self._rotation = (self._rotation + 1) % len(live)
        rid = live[self._rotation].replica_id
        self._home[r.req_id] = rid
        return rid

    def _heads(self, view: ClusterView) -> dict[int, RouteRequest]:
        """Each replica's queue head (the held request first in its order)."""
        heads: dict[int, RouteRequest] = {}
        for r in sorted(self._held.values(), key=self._key):
            rid = self._home_of(r, view)
            if rid is not None and rid not in heads:
                heads[rid] = r
        return heads

    def route(self, req: RouteRequest, view: ClusterView) -> Decision:
        self._see(req, view)
        rid = self._home_of(req, view)
        if rid is None:
            return Hold("no_replica")
        v = view.replica(rid)
        head = self._heads(view).get(rid)
        if head is None or head.req_id != req.req_id:
            return Hold("behind_head")
        if not (self._serves(v, req.model) and self._has_room(v)):
            return Hold("no_room")
        self._home.pop(req.req_id, None)
        return self._dispatch(req, rid)

    def on_tick(self, now: float, view: ClusterView, queued: Mapping[str, int]) -> list[Action]:
        return self._actions(view)

    def on_event(self, event: Event, view: ClusterView) -> list[Action]:
        if event.kind == "arrival" and event.req_id is not None and self.hooks is not None:
            return super().on_event(event, view)  # seen as QLM sees it; nothing to plan
        if event.kind == "finish" and event.req_id is not None:
            self._finished(event.req_id)
        return self._actions(view)

    def _actions(self, view: ClusterView) -> list[Action]:
        out: list[Action] = []
        for rid, model in list(self._changing.items()):
            v = view.replica(rid)
            if v.model == model and v.status is ReplicaStatus.UP:
                del self._changing[rid]
        heads = self._heads(view)
        # the base class's reorders carry the ids as routed (ints in a simulation)
        fronts: dict[str, list[Any]] = {}
        for rid, head in sorted(heads.items()):
            v = view.replica(rid)
            if head.model in ("default", v.model) and rid not in self._changing:
                fronts.setdefault(head.model, []).append(head.req_id)
            elif v.status is ReplicaStatus.UP and rid not in self._changing:
                # the naive swap: the head wants another model, change now
                out.append(change(self, rid, head.model))
        if self.hooks is not None:
            for rid in heads:
                self.hooks.set_warm(rid, set())  # nothing kept warm in CPU memory
        out += [ReorderQueue(m, tuple(ids)) for m, ids in sorted(fronts.items())]
        return out

    def summary(self) -> dict[str, Any]:
        d = super().summary()
        d["mode"] = self.name
        d["assign"] = self.assign
        return d


def make_naive_swap_router(order: str, seed: int = 0, **params: Any) -> NaiveSwapRouter:
    """``fcfs-swap`` (``order="fcfs"``) or ``edf-swap``; ``assign`` (``rotation`` or
    ``model``, module docstring), the rest as :func:`make_qlm_router` (only ``tick_s`` and
    the deadline defaults matter here)."""
    assign = params.pop("assign", "rotation")
    if assign not in _ASSIGN:
        raise ConfigError(
            f"router '{order}-swap': assign must be {' or '.join(_ASSIGN)}, got {assign!r}"
        )
    return NaiveSwapRouter(make_qlm_router(order, seed, **params), order, assign)
