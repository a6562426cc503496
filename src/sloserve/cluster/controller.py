"""Controllers: code that watches the cluster and asks it to change (autoscalers, planners).

A :class:`Controller` gets periodic ticks (every ``tick_s``) and events (an arrival, a
request ending, a replica failing), each with the read-only
:class:`~sloserve.cluster.view.ClusterView`, and returns :data:`Action` objects; the cluster
applies them, in order, at once. One exception: when the actions answering a ``finish`` include
a :class:`Requeue` of the replica that request finished on, that replica is still retiring its
batch, so the whole list is applied, in order, at the same instant right after the retire
(and after the finish's own queue pulls). A controller never touches an instance.

Actions and what the cluster does with them:

- :class:`AddReplica` ``(group)``: a new replica of that group joins now (ids continue
  after the configured ones) and pays a cold start (a load from disk) if ``cold_start``.
- :class:`RemoveReplica` ``(replica)``: drain it (it finishes what it holds, then leaves).
- :class:`ChangeModel` ``(replica, model)``: the replica stops accepting, finishes what it
  holds, loads ``model`` (``LOADING``, paying the load time) and serves it.
- :class:`Requeue` ``(replica)``: every request the replica holds goes back to the global
  queue and is routed again, from scratch (like a failover: counted in ``failovers``).
- :class:`Reroute` ``(replica, req_id)``: if that request is still waiting on the replica
  and has not started there (nothing computed, never admitted), it leaves the replica and
  is routed again, like a new arrival (Aladdin's re-balancing moves placed, unstarted
  requests); a request that started, ended or is elsewhere stays where it is.
- :class:`ReorderQueue` ``(model, req_ids)``: those queued requests move to the front of
  that model's global queue, in that order (later arrivals are inserted by priority and
  arrival among the rest).

An action naming a replica that cannot do it (a left replica, a model the registry does not
know) is ignored when the state makes it moot and an error when it is malformed.

The built-in :class:`UtilisationAutoscaler` (``cluster.autoscaler``): at each tick, the
group's utilisation is the mean over its UP replicas of ``min(1, outstanding / R_max)``;
above ``scale_up_util`` it adds a replica (up to ``max``), below ``scale_down_util`` it
drains the newest UP one (down to ``min``). While one of the group's replicas is joining or
loading it waits (a cold start is not yet capacity). Replicas count towards ``min``/``max``
unless draining, failed or gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sloserve.cluster.view import ClusterView, ReplicaStatus
from sloserve.core.bounds import MAX_COUNT, Seconds


@dataclass(frozen=True, slots=True)
class AddReplica:
    group: int


@dataclass(frozen=True, slots=True)
class RemoveReplica:
    replica: int


@dataclass(frozen=True, slots=True)
class ChangeModel:
    replica: int
    model: str


@dataclass(frozen=True, slots=True)
class Requeue:
    replica: int


@dataclass(frozen=True, slots=True)
class Reroute:
    replica: int
    req_id: int


@dataclass(frozen=True, slots=True)
class ReorderQueue:
    model: str
    req_ids: tuple[int, ...]


Action = AddReplica | RemoveReplica | ChangeModel | Requeue | Reroute | ReorderQueue


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened: an ``arrival`` or ``finish`` (``req_id``), a ``failure``
    (``replica``)."""

    kind: Literal["arrival", "finish", "failure"]
    time: float
    req_id: int | None = None
    replica: int | None = None


class Controller(Protocol):
    """Extension point: watch the cluster, return actions (module docstring)."""

    tick_s: float | None
    """Seconds between ticks (None: no ticks)."""
    wants_events: bool
    """Whether :meth:`on_event` should be called (False keeps the event path free)."""

    def on_tick(
        self, now: float, view: ClusterView, queued: Mapping[str, int]
    ) -> Sequence[Action]: ...

    def on_event(self, event: Event, view: ClusterView) -> Sequence[Action]: ...


class AutoscalerConfig(BaseModel):
    """``cluster.autoscaler``: the utilisation-threshold autoscaler of one group."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    group: int = Field(default=0, ge=0, le=MAX_COUNT, description="the replica group it scales")
    min: int = Field(default=1, ge=1, le=65_536, description="fewest replicas of the group")
    max: int = Field(default=8, ge=1, le=65_536, description="most replicas of the group")
    scale_up_util: float = Field(default=0.8, gt=0, le=1, description="add above this")
    scale_down_util: float = Field(default=0.2, ge=0, lt=1, description="drain below this")
    tick_s: Seconds = Field(default=10.0, description="seconds between decisions")

    @model_validator(mode="after")
    def _order(self) -> AutoscalerConfig:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        if self.scale_down_util >= self.scale_up_util:
            raise ValueError(
                f"scale_down_util {self.scale_down_util} must be below "
                f"scale_up_util {self.scale_up_util}"
            )
        return self


_COUNTED = (ReplicaStatus.JOINING, ReplicaStatus.LOADING, ReplicaStatus.UP)


class UtilisationAutoscaler:
    """Scale one group between ``min`` and ``max`` on its utilisation (module docstring)."""

    wants_events = False

    def __init__(self, cfg: AutoscalerConfig) -> None:
        self.cfg = cfg
        self.tick_s: float | None = cfg.tick_s
        self.decisions: list[tuple[float, str, float]] = []
        """(time, action, utilisation) of each scaling decision."""

    def on_tick(self, now: float, view: ClusterView, queued: Mapping[str, int]) -> list[Action]:
        c = self.cfg
        mine = [v for v in view.replicas() if v.group == c.group and v.status in _COUNTED]
        if any(v.status is not ReplicaStatus.UP for v in mine):
            return []
        up = [v for v in mine if v.status is ReplicaStatus.UP]
        if not up:
            return [AddReplica(c.group)] if len(mine) < c.max else []
        util = sum(min(1.0, v.outstanding / max(v.capacity, 1)) for v in up) / len(up)
        if util > c.scale_up_util and len(mine) < c.max:
            self.decisions.append((now, "add", util))
            return [AddReplica(c.group)]
        if util < c.scale_down_util and len(mine) > c.min:
            self.decisions.append((now, "remove", util))
            return [RemoveReplica(max(v.replica_id for v in up))]
        return []

    def on_event(self, event: Event, view: ClusterView) -> list[Action]:
        return []
