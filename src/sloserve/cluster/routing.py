"""Cluster routers: Filter → Scorer (min-max normalised, weighted) → Picker, or hold.

A router gets a :class:`~sloserve.cluster.view.RouteRequest` and the read-only
:class:`~sloserve.cluster.view.ClusterView` and returns a replica id, or a :class:`Hold`:
the request then waits in the cluster's global queue, and the cluster asks again when a
replica of that model frees room (a request there ends) or one joins or recovers (pull).
Candidates are the replicas serving the request's model; the first filter always keeps
only those that accept requests (status UP). No candidate left is a hold, never an error.

One router object, two clocks: these very objects route in the simulated cluster and in
the live gateway (``sloserve serve``: the ``emulated`` backend runs a cluster in wall time,
the ``openai`` backend builds a :class:`ClusterView` of its upstreams per decision and maps
a :class:`Hold` onto its own queue).

Stages (the functions themselves live in ``cluster/route_stages.py``; the router objects
and their registry here):

1. **Filters** narrow the candidate list (accepting; ``max_outstanding``; the TTFT target;
   power-of-two's seeded sample of two).
2. **Scorers** give each candidate a raw cost (lower is better); each scorer's costs are
   min-max normalised over the candidates and summed by weight. A non-finite cost counts
   as the worst (1). A scorer on which every candidate is equal does not decide.
3. A **picker** chooses: the lowest total score with ties broken in rotation (identical idle
   replicas share the load rather than the first taking everything), the first candidate
   (``pass-through``), a rotation (``round-robin``) or a seeded uniform draw (``random``).

Choices where the papers are vague (all parameters, see :func:`make_router`):

- ``least-outstanding`` is like Vidur's LOR but counts every request held (waiting +
  running + swapped) and breaks ties in rotation; Vidur's exact LOR is ``vidur-lor``.
  With ``max_outstanding`` set it holds a request in the global queue when every replica
  already has that many, and the cluster hands it out as soon as one has room.
- ``jsq-tokens`` scores queued prompt tokens, with outstanding requests as a 0.1-weight
  tie-break (with nothing to prefill anywhere, fewer decodes wins).
- ``least-loaded`` and ``power-of-two`` score ``outstanding`` (in the gateway: the larger
  of its in-flight count and the engine's running + waiting) with KV usage as a second
  scorer (``kv_weight``, 0.25): among equally loaded replicas the one with more free KV
  (fewer preemptions) wins. ``power-of-two`` first samples two candidates (Mitzenmacher:
  close to JSQ with stale load information, without herding onto the one that looked
  idle at the last scrape).
- ``slo-aware`` keeps replicas whose predicted TTFT meets the request's TTFT target (all of
  them when none does: whether to shed is admission's call, not the router's) and scores
  the predicted TTFT (weight 1) and KV usage (``kv_weight``, 0.25). The prediction is the
  view's (the simulated replica's cost model; a gateway's cost-model estimate); a replica
  without one (an upstream gateway without a ``profile``) gets a queue estimate: its
  queued prompt tokens plus the request's × ``prefill_s_per_token`` (1e-4 s) plus one
  ``decode_s_per_iter`` (20 ms) per running or waiting request interleaved (roughly a 7B
  model on an A100). A non-finite estimate scores worst.
- Randomised routers draw from a ``random.Random(seed)`` they own: runs are reproducible.
"""

from __future__ import annotations

import importlib
import inspect
import math
import random
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sloserve.cluster.least_outstanding import least_outstanding_pick
from sloserve.cluster.route_stages import (
    Filter,
    LowestPick,
    Picker,
    ScoreFn,
    ScoreManyFn,
    Scorer,
    accepting,
    first_pick,
    kv_score,
    lowest_pick,
    max_outstanding_filter,
    normalised_scores,
    one_scorer_lowest,
    outstanding_score,
    queued_tokens_score,
    random_pick,
    rotation_pick,
    sample_filter,
    ttft_estimate,
    ttft_score,
    ttft_target_filter,
)
from sloserve.cluster.view import ClusterView, RouteRequest
from sloserve.core.errors import ConfigError, UnknownNameError, did_you_mean

__all__ = [  # the stages (route_stages.py) keep this import path: routers import them here
    "Decision",
    "Filter",
    "Hold",
    "Picker",
    "PipelineRouter",
    "Router",
    "RouterFactory",
    "ScoreFn",
    "ScoreManyFn",
    "Scorer",
    "accepting",
    "check_router",
    "first_pick",
    "kv_score",
    "lowest_pick",
    "make_router",
    "max_outstanding_filter",
    "normalised_scores",
    "outstanding_score",
    "queued_tokens_score",
    "random_pick",
    "register_router",
    "rotation_pick",
    "route_explained",
    "router_names",
    "router_summaries",
    "sample_filter",
    "ttft_estimate",
    "ttft_score",
    "ttft_target_filter",
]


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep the request in the global queue; the cluster asks again when room frees up."""

    reason: str


Decision = int | Hold
"""A replica id, or a hold."""


# ------------------------------------------------------------------------------ routers


class Router(ABC):
    """Picks a replica for a request, or holds it. Extension point: subclass, or build a
    :class:`PipelineRouter` and :func:`register_router` it."""

    name: str = "router"
    reads_progress: bool = True
    """Whether the router reads a replica's progress (queued tokens, KV usage, predicted
    TTFT, busy time) rather than only its request counts, model and status. A router that
    does not lets each replica fast-forward past the other replicas' iterations (a
    speed-up: request counts are the same at every routing decision either way); one
    that does keeps every replica stopping at every event, so that what it reads is what
    it read before. Unknown routers are assumed to read it."""
    reads_kv_only: bool = False
    """Whether the only progress it reads is KV usage, which the cluster's view gives
    exactly mid-run (as if the run had been stopped there): such a router lets replicas
    fast-forward as a count-only one does, with the same results."""

    @abstractmethod
    def route(self, req: RouteRequest, view: ClusterView) -> Decision:
        """A replica id serving ``req.model`` that accepts requests, or a :class:`Hold`."""


class PipelineRouter(Router):
    """Filters, then weighted normalised scorers, then a picker (module docstring)."""

    def __init__(
        self,
        name: str,
        filters: Sequence[Filter],
        scorers: Sequence[Scorer],
        picker: Picker,
        *,
        hold_reason: str = "no_candidate",
        reads_progress: bool = True,
        reads_kv_only: bool = False,
    ) -> None:
        self.name = name
        self.reads_progress = reads_progress
        self.reads_kv_only = reads_kv_only
        self.filters = [accepting, *filters]
        self.scorers = list(scorers)
        self.picker = picker
        self.hold_reason = hold_reason
        """Why a request is held when a filter after ``accepting`` empties the list."""

    def route(
        self, req: RouteRequest, view: ClusterView, explain: dict[str, Any] | None = None
    ) -> Decision:
        """The decision; with ``explain`` (a dict), the same decision, and ``explain`` gets
        ``considered`` (accepting replica ids), ``candidates`` (after every filter),
        ``scores`` (scorer name -> normalised score per candidate) and ``total``."""
        if explain is None:  # the common case: no bookkeeping per filter
            picker, scorers, filters = self.picker, self.scorers, self.filters
            if (  # least-outstanding as built: the pick every arrival of such a run makes
                len(scorers) == 1
                and scorers[0].fn is outstanding_score
                and type(picker) is LowestPick
                and len(filters) == 1
                and filters[0] is accepting
                and 0 < scorers[0].weight < math.inf
            ):
                decided = least_outstanding_pick(req, view, picker, scorers[0].weight)
                if decided is not None:
                    return decided
            cand = list(view.serving(req.model))
            first = True
            for f in self.filters:
                cand = f(req, cand)
                if not cand:
                    return Hold("no_replica" if first else self.hold_reason)
                first = False
            # One scorer and the lowest picker (least-outstanding, least-kv): one pass over
            # the candidates, which a many-replica cluster pays on every arrival.
            if (
                type(picker) is LowestPick
                and len(scorers) == 1
                and 0 < scorers[0].weight < math.inf
            ):
                pick = one_scorer_lowest(req, cand, scorers[0], picker)
                if pick is not None:
                    return pick.replica_id
            return picker(cand, normalised_scores(req, cand, scorers)).replica_id
        cand = list(view.serving(req.model))
        for i, f in enumerate(self.filters):
            cand = f(req, cand)
            if i == 0:
                explain["considered"] = [c.replica_id for c in cand]
            if not cand:
                return Hold("no_replica" if i == 0 else self.hold_reason)
        per: dict[str, list[float]] = {}
        scores = normalised_scores(req, cand, self.scorers, per)
        explain["candidates"] = [c.replica_id for c in cand]
        explain["scores"] = per
        explain["total"] = scores
        return self.picker(cand, scores).replica_id


# ------------------------------------------------------------------------------ registry

RouterFactory = Callable[..., Router]
"""Keyword parameters (from ``router_params``) plus ``seed`` → a fresh router."""


def _pass_through(seed: int) -> Router:
    return PipelineRouter("pass-through", [], [], first_pick, reads_progress=False)


def _random(seed: int) -> Router:
    return PipelineRouter("random", [], [], random_pick(random.Random(seed)), reads_progress=False)


def _round_robin(seed: int) -> Router:
    return PipelineRouter("round-robin", [], [], rotation_pick(), reads_progress=False)


def _least_outstanding(seed: int, max_outstanding: int | None = None) -> Router:
    if max_outstanding is not None and max_outstanding < 1:
        raise ConfigError(f"router_params.max_outstanding must be >= 1, got {max_outstanding}")
    filters = [] if max_outstanding is None else [max_outstanding_filter(max_outstanding)]
    return PipelineRouter(
        "least-outstanding",
        filters,
        [Scorer("outstanding", outstanding_score)],
        lowest_pick(),
        hold_reason="max_outstanding",
        reads_progress=False,
    )


def _least_loaded(seed: int, kv_weight: float = 0.25) -> Router:
    # The gateway's least-loaded: requests held, with KV usage breaking near-ties so that
    # among equally loaded replicas the one with more free KV (fewer preemptions) wins.
    return PipelineRouter(
        "least-loaded",
        [],
        [Scorer("outstanding", outstanding_score), Scorer("kv", kv_score, kv_weight)],
        lowest_pick(),
        reads_kv_only=True,
    )


def _jsq_tokens(seed: int, outstanding_weight: float = 0.1) -> Router:
    return PipelineRouter(
        "jsq-tokens",
        [],
        [
            Scorer("queued_tokens", queued_tokens_score),
            Scorer("outstanding", outstanding_score, outstanding_weight),
        ],
        lowest_pick(),
    )


def _power_of_two(seed: int, kv_weight: float = 0.25) -> Router:
    return PipelineRouter(
        "power-of-two",
        [sample_filter(random.Random(seed))],
        [Scorer("outstanding", outstanding_score), Scorer("kv", kv_score, kv_weight)],
        lowest_pick(),
        # The KV tie-break reads progress; with kv_weight 0 it only counts requests.
        reads_progress=kv_weight > 0,
        reads_kv_only=True,
    )


def _least_kv(seed: int) -> Router:
    return PipelineRouter(
        "least-kv", [], [Scorer("kv", kv_score)], lowest_pick(), reads_kv_only=True
    )


def _slo_aware(
    seed: int,
    kv_weight: float = 0.25,
    prefill_s_per_token: float = 1.0e-4,
    decode_s_per_iter: float = 0.02,
) -> Router:
    estimate = ttft_estimate(prefill_s_per_token, decode_s_per_iter)
    return PipelineRouter(
        "slo-aware",
        [ttft_target_filter(estimate)],
        [Scorer("ttft", estimate), Scorer("kv", kv_score, kv_weight)],
        lowest_pick(),
    )


_ROUTERS: dict[str, tuple[RouterFactory, str]] = {
    "pass-through": (_pass_through, "the first accepting replica (one replica: itself)"),
    "random": (_random, "uniform over accepting replicas, seeded"),
    "round-robin": (_round_robin, "accepting replicas in turn"),
    "least-outstanding": (
        _least_outstanding,
        "fewest requests held (like Vidur's LOR); max_outstanding holds beyond it",
    ),
    "least-loaded": (_least_loaded, "fewest requests held, then lowest KV usage (weight 0.25)"),
    "jsq-tokens": (_jsq_tokens, "join the shortest queue by prompt tokens still to prefill"),
    "power-of-two": (
        _power_of_two,
        "the less loaded of two sampled replicas (KV usage breaks near-ties), seeded",
    ),
    "least-kv": (_least_kv, "lowest KV cache usage"),
    "slo-aware": (_slo_aware, "lowest predicted TTFT among those meeting the TTFT target"),
}


_LAZY: dict[str, str] = {
    "aladdin": "sloserve.cluster.aladdin.router",
    **dict.fromkeys(
        ("qlm", "edf", "fcfs", "fcfs-swap", "edf-swap", "static-batch"), "sloserve.cluster.qlm"
    ),
}
"""Routers registered by packages above this module, imported when one of their names is
first asked for (start-up time: Aladdin's and QLM's packages cost ~0.1 s of CPU to import,
which a run with another router never needs). Each package registers itself on import."""


def _provide(name: str) -> None:
    """Import the package that registers ``name`` if it is a lazy one not imported yet
    (a package being imported is in ``sys.modules`` already: no recursion)."""
    provider = _LAZY.get(name)
    if provider is not None and provider not in sys.modules:
        importlib.import_module(provider)


def register_router(name: str, factory: RouterFactory, summary: str) -> None:
    """Add a router (extension point); a name already taken is an error."""
    _provide(name)  # a lazily registered name is taken too, imported or not
    if name in _ROUTERS:
        raise ConfigError(f"router {name!r} is already registered")
    _ROUTERS[name] = (factory, summary)


def router_names() -> list[str]:
    """The names :func:`make_router` accepts, sorted."""
    for provider in dict.fromkeys(_LAZY.values()):
        if provider not in sys.modules:
            importlib.import_module(provider)
    return sorted(_ROUTERS)


def router_summaries() -> dict[str, str]:
    """One line per router, by name (``sloserve routers`` prints them)."""
    return {n: _ROUTERS[n][1] for n in router_names()}


def check_router(name: str, params: Mapping[str, Any] | None = None) -> RouterFactory:
    """The factory of ``name`` after checking ``params`` names against it."""
    _provide(name)
    try:
        factory = _ROUTERS[name][0]
    except KeyError:
        raise UnknownNameError(
            f"unknown router {name!r}{did_you_mean(name, router_names())}; "
            f"choose one of: {', '.join(router_names())}"
        ) from None
    try:
        inspect.signature(factory).bind(seed=0, **dict(params or {}))
    except TypeError:
        allowed = [p for p in inspect.signature(factory).parameters if p != "seed"]
        raise ConfigError(
            f"router {name!r}: unknown parameter in {sorted(params or {})}; "
            f"valid: {', '.join(allowed) or 'none'}"
        ) from None
    return factory


def make_router(name: str, params: Mapping[str, Any] | None = None, *, seed: int = 0) -> Router:
    """A fresh router by name (routers keep state: rotation pointers, RNGs)."""
    return check_router(name, params)(seed=seed, **dict(params or {}))


def route_explained(
    router: Router, rr: RouteRequest, view: ClusterView
) -> tuple[int | Hold, dict[str, Any]]:
    """Route ``rr`` and describe the decision (the cluster's ``trace_decisions`` record,
    less its time, queueing time and class)."""
    rec: dict[str, Any] = {}
    if isinstance(router, PipelineRouter):
        d = router.route(rr, view, explain=rec)
    else:
        d = router.route(rr, view)
    return d, {
        "req_id": rr.req_id,
        "time": 0.0,
        "model": rr.model,
        "class": "",
        "priority": rr.priority,
        "considered": rec.get("considered", []),
        "candidates": rec.get("candidates", []),
        "scores": rec.get("scores", {}),
        "total": rec.get("total", []),
        "pick": -1 if isinstance(d, Hold) else d,
        "hold": d.reason if isinstance(d, Hold) else "",
        "queue_s": 0.0,
    }


import sloserve.cluster.vidur_lor  # noqa: E402, F401  (registers "vidur-lor"; needs the above)
