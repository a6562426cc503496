"""What a router sees of the cluster: a read-only :class:`ClusterView` of replicas.

A router never touches an ``Instance``: it reads :class:`ReplicaView` objects, grouped by
the model they serve. Two implementations of the same protocol exist so that one router
object works on both clocks:

- the simulated cluster's live views (``cluster/replica.py``), which read the replica's
  queues when asked, so that nothing is computed for a replica no router looks at (the
  predicted TTFT in particular is priced only when a router calls for it);
- :class:`StaticReplica`, a frozen snapshot for hand-built views in tests; the gateway's
  ``openai`` backend builds its own snapshots from what it scrapes and observes of each
  upstream (``serve/replica_view.py``), and its ``emulated`` backend runs a
  :class:`~sloserve.cluster.cluster.Cluster` in wall time, so it uses the live views.

Choices: a replica loading a model is :attr:`ReplicaStatus.LOADING`; only
:attr:`ReplicaStatus.UP` replicas accept requests. ``outstanding`` counts what the replica
holds (waiting + running + swapped); a gateway fills it with the larger of its own
in-flight count and the engine's scraped running + waiting (its count is fresh, the
engine's includes other clients). A request whose model is ``"default"`` (the workload
named none) may be served by any replica.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sloserve.core.request import SLO, Request


class ReplicaStatus(str, enum.Enum):
    """A replica's lifecycle state, as routers and accounting see it."""

    JOINING = "joining"
    """Configured, not yet started (before its ``start_s``)."""
    LOADING = "loading"
    """Started, loading a model (a cold start or a model change): serves nothing."""
    UP = "up"
    """Serving: the only state that accepts requests."""
    BUSY = "busy"
    """Up but takes nothing right now (a gateway's per-upstream concurrency limit is
    reached, or this request already failed there): it waits in the gateway's queue."""
    DRAINING = "draining"
    """Finishing what it holds, accepting nothing; leaves when empty."""
    FAILED = "failed"
    """Down; what it held went back to the global layer. May recover."""
    LEFT = "left"
    """Gone for good (drained, or failed while draining)."""


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a router knows of a request: no output length (that stays hidden)."""

    req_id: int | str
    model: str
    prompt_tokens: int
    arrival: float = 0.0
    slo: SLO = field(default_factory=SLO)
    priority: int = 0
    hash_ids: tuple[int, ...] | None = None
    """The prompt's identity blocks (a trace's ``hash_ids``; in the gateway, hashed text
    chunks): what prefix-aware routers match."""
    session_id: int | str | None = None
    """The session it belongs to, if known (what session affinity sticks by)."""

    @classmethod
    def of(cls, r: Request) -> RouteRequest:
        return cls(
            r.req_id,
            r.model,
            r.num_prompt_tokens,
            r.arrival,
            r.slo,
            r.priority,
            r.hash_ids,
            r.session_id,
        )


class ReplicaView(Protocol):
    """One replica as a router sees it (read-only; values are current when read)."""

    @property
    def replica_id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def group(self) -> int:
        """The replica group it belongs to."""
        ...

    @property
    def capacity(self) -> int:
        """Requests it can run at once (R_max)."""
        ...

    @property
    def model(self) -> str: ...
    @property
    def status(self) -> ReplicaStatus: ...
    @property
    def running(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def swapped(self) -> int: ...
    @property
    def outstanding(self) -> int: ...
    @property
    def queued_prompt_tokens(self) -> int:
        """Tokens still to prefill (or refill) there before their first (next) token."""
        ...

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache in use, 0..1 (``nan`` when unknown)."""
        ...

    def predicted_ttft_s(self, req: RouteRequest) -> float | None:
        """The replica's estimate of ``req``'s TTFT if sent there now (None: no estimate)."""
        ...

    def cached_prefix_tokens(self, req: RouteRequest) -> int | None:
        """Tokens of ``req``'s prompt prefix in the replica's prefix cache now (None:
        unknown, as for an upstream engine; prefix routers then use their own index).

        A replica answers None always or never: the prefix routers record their own index
        of a replica only while it answers None (``cluster/prefix_routing.py``), so an
        answer that lapses to None would find that index missing what it routed there
        while it answered.

        A view class may also answer for many of its views at once, with a static
        ``cached_prefix_tokens_many(req, views) -> Sequence[int | None]`` defined in the
        class itself (the same answers, in order): :func:`cached_prefix_tokens_all` then
        asks it once a decision."""
        ...


@dataclass(frozen=True, slots=True)
class StaticReplica:
    """A snapshot :class:`ReplicaView` (tests, the gateway's scraped state)."""

    replica_id: int
    model: str = "default"
    status: ReplicaStatus = ReplicaStatus.UP
    running: int = 0
    waiting: int = 0
    swapped: int = 0
    outstanding: int = 0
    queued_prompt_tokens: int = 0
    kv_usage: float = 0.0
    ttft_s: float | None = None
    """The fixed TTFT estimate :meth:`predicted_ttft_s` returns."""
    cached_tokens: int | None = None
    """The fixed answer of :meth:`cached_prefix_tokens`."""
    name: str = ""
    group: int = 0
    capacity: int = 256

    def predicted_ttft_s(self, req: RouteRequest) -> float | None:
        return self.ttft_s

    def cached_prefix_tokens(self, req: RouteRequest) -> int | None:
        return self.cached_tokens


def cached_prefix_tokens_all(
    req: RouteRequest, cand: Sequence[ReplicaView]
) -> Sequence[int | None]:
    """Every candidate's :meth:`ReplicaView.cached_prefix_tokens` for ``req``, in order: one
    call a routing decision instead of one a candidate. When the candidates are all views
    of one class that defines ``cached_prefix_tokens_many`` itself (the simulated
    replicas': one pass over their caches that computes the prompt's keys once,
    ``engine/prefix_peek.py``) that class answers for all of them; otherwise each view is
    asked (the gateway's upstreams answer None: a prefix router then reads its own index).
    An inherited batch answer is not used: it would bypass a subclass's own
    ``cached_prefix_tokens``."""
    if not cand:
        return []
    cls = type(cand[0])
    many: Callable[[RouteRequest, Sequence[ReplicaView]], Sequence[int | None]] | None
    many = cls.__dict__.get("cached_prefix_tokens_many")
    if many is not None:
        for r in cand:
            if type(r) is not cls:
                break
        else:
            answers: Sequence[int | None] = many(req, cand)
            return answers
    return [r.cached_prefix_tokens(req) for r in cand]


class ClusterView:
    """The replicas, by the model they serve, in replica-id order; read-only for routers.

    The simulated cluster builds one view at the start and its live replica views stay
    current, so routing costs nothing per event beyond the scoring itself.
    """

    def __init__(
        self, replicas: Iterable[ReplicaView], clock: Callable[[], float] = lambda: 0.0
    ) -> None:
        self._by_model: dict[str, list[ReplicaView]] = {}
        self._by_id: dict[int, ReplicaView] = {}
        self._every: tuple[ReplicaView, ...] | None = None
        """Every replica, for a request that names no model when none serves "default"."""
        for r in sorted(replicas, key=lambda v: v.replica_id):
            if r.replica_id in self._by_id:
                raise ValueError(f"replica id {r.replica_id} appears twice in the view")
            self._by_id[r.replica_id] = r
            self._by_model.setdefault(r.model, []).append(r)
        self._clock = clock

    @property
    def now(self) -> float:
        return self._clock()

    def serving(self, model: str) -> Sequence[ReplicaView]:
        """Every replica (any status) that serves ``model``; a request that names no model
        (``"default"``) may go to any replica unless some replica serves ``"default"``."""
        found = self._by_model.get(model)
        if found is not None:
            return found
        if model != "default":
            return ()
        every = self._every
        if every is None:  # (once, not a new list per arrival; reset when one joins)
            every = self._every = tuple(self._by_id.values())
        return every

    def replicas(self) -> list[ReplicaView]:
        """Every replica, by id."""
        return list(self._by_id.values())

    def add(self, r: ReplicaView) -> None:
        """A replica joined the cluster (a controller added it)."""
        if r.replica_id in self._by_id:
            raise ValueError(f"replica id {r.replica_id} appears twice in the view")
        self._by_id[r.replica_id] = r
        self._by_model.setdefault(r.model, []).append(r)
        self._every = None

    def moved(self, replica_id: int, old_model: str) -> None:
        """Replica ``replica_id`` now serves another model (it was serving ``old_model``)."""
        r = self._by_id[replica_id]
        old = self._by_model.get(old_model, [])
        if r in old:
            old.remove(r)
        if not old:
            self._by_model.pop(old_model, None)
        new = self._by_model.setdefault(r.model, [])
        new.append(r)
        new.sort(key=lambda v: v.replica_id)

    def models(self) -> list[str]:
        return sorted(self._by_model)

    def replica(self, replica_id: int) -> ReplicaView:
        return self._by_id[replica_id]

    def __len__(self) -> int:
        return len(self._by_id)
