"""Routers of the serving gateway: Filter → Scorer (normalised, weighted) → Picker.

A router picks the replica (an emulated engine or an upstream server) for one request from
the backend's current :class:`~sloserve.serve.backend.ReplicaState` list. Every router is
the same three stages, so a new one is a new combination rather than new control flow:

1. **Filters** drop replicas that cannot take the request (unhealthy; for ``slo-aware``,
   replicas whose predicted TTFT already misses the request's TTFT target — unless every
   replica misses it, then the filter keeps them all and admission decides).
2. **Scorers** map each remaining replica to a raw cost (lower is better). Each scorer's
   costs are min-max normalised to [0, 1] over the candidates, so scorers with different
   units (requests, seconds, a KV fraction) combine by weight.
3. A **picker** chooses among the candidates by their weighted score: the lowest score
   (ties broken in rotation, so identical idle replicas share the load instead of the first
   one taking everything), a rotation (``round-robin``), or the better of two sampled with
   a seeded RNG (``power-of-two``).

Choices where the papers are vague (all parameters of :func:`make_router`):

- *Load* (``least-loaded``, ``power-of-two``) is ``max(in_flight, running + waiting)``: the
  gateway's own count is fresh, the engine's scraped count lags but includes requests from
  other clients; the larger is the safer estimate. KV usage is a second scorer with weight
  0.25, so among equally loaded replicas the one with more free KV (fewer preemptions) wins.
- *SLO-aware* scores a replica by its predicted TTFT for the request: the backend's
  ``predicted_ttft_s`` when it can make one (a cost model), otherwise a queue-based
  estimate: the prompt tokens queued there plus this request's, times a per-token prefill
  time, plus one iteration per running request's decode step interleaved
  (``prefill_s_per_token``, ``decode_s_per_iter``; the defaults approximate a 7B model on
  an A100). Weighted with KV usage (0.25) to steer away from replicas about to preempt.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sloserve.core.errors import ConfigError, UnknownNameError
from sloserve.serve.backend import GenerationRequest, ReplicaState, Router

Filter = Callable[[GenerationRequest, Sequence[ReplicaState], list[int]], list[int]]
"""Given the request, all replicas and the candidate indices, the candidates that remain."""
ScoreFn = Callable[[GenerationRequest, ReplicaState], float]
"""A replica's raw cost for the request (lower is better), in any unit."""


@dataclass(frozen=True, slots=True)
class Scorer:
    """One weighted criterion: raw costs are min-max normalised over the candidates."""

    name: str
    fn: ScoreFn
    weight: float = 1.0


# ---------------------------------------------------------------------------- filters


def healthy_filter(
    req: GenerationRequest, replicas: Sequence[ReplicaState], cand: list[int]
) -> list[int]:
    """Only replicas that report healthy (breaker closed, health check passing)."""
    return [i for i in cand if replicas[i].healthy]


def ttft_slo_filter_factory(estimate: ScoreFn) -> Filter:
    """Keep the replicas whose estimated TTFT meets the request's TTFT target.

    When none does, keep them all: the router still has to pick, and whether to reject the
    request is admission's decision, not the router's.
    """

    def ttft_slo_filter(
        req: GenerationRequest, replicas: Sequence[ReplicaState], cand: list[int]
    ) -> list[int]:
        target = req.slo.ttft_s
        if target is None:
            return cand
        ok = [i for i in cand if estimate(req, replicas[i]) <= target]
        return ok or cand

    return ttft_slo_filter


# ---------------------------------------------------------------------------- scores


def load_score(req: GenerationRequest, r: ReplicaState) -> float:
    """Requests at the replica: the larger of the gateway's and the engine's count."""
    return float(max(r.in_flight, r.running + r.waiting))


def kv_score(req: GenerationRequest, r: ReplicaState) -> float:
    """KV cache in use (unknown counts as empty: no evidence of pressure)."""
    return 0.0 if math.isnan(r.kv_usage) else r.kv_usage


def queue_ttft_estimate(prefill_s_per_token: float, decode_s_per_iter: float) -> ScoreFn:
    """TTFT estimate: the backend's prediction if it has one, else from the queue."""

    def estimate(req: GenerationRequest, r: ReplicaState) -> float:
        if r.predicted_ttft_s is not None:
            return r.predicted_ttft_s
        ahead = r.queued_prompt_tokens + req.prompt_tokens
        # Engines interleave prefill with the running requests' decode steps: count one
        # iteration per running (or waiting) request as interference.
        return ahead * prefill_s_per_token + (r.running + r.waiting) * decode_s_per_iter

    return estimate


# ---------------------------------------------------------------------------- pickers


def normalised_scores(
    req: GenerationRequest,
    replicas: Sequence[ReplicaState],
    cand: Sequence[int],
    scorers: Sequence[Scorer],
) -> list[float]:
    """Weighted sum over scorers of min-max normalised costs, one per candidate.

    A non-finite cost (``nan``: no idea, ``inf``: hopeless) counts as the worst, 1, so it
    neither wins nor spoils the normalisation of the others.
    """
    total = [0.0] * len(cand)
    for s in scorers:
        raw = [float(s.fn(req, replicas[i])) for i in cand]
        finite = [v for v in raw if math.isfinite(v)]
        if not finite or (len(finite) == len(raw) and min(finite) == max(finite)):
            continue  # every candidate equal on this criterion: it cannot decide
        lo, hi = min(finite), max(finite)
        span = hi - lo
        for k, v in enumerate(raw):
            if not math.isfinite(v):
                total[k] += s.weight
            elif span > 0:
                total[k] += s.weight * (v - lo) / span
    return total


class PipelineRouter(Router):
    """Filters, then weighted normalised scorers, then a picker (see module docstring).

    Subclasses set the stages; :meth:`choose` is the picker and gets the candidates (indices
    into ``replicas``) with their scores.
    """

    def __init__(self, filters: Sequence[Filter], scorers: Sequence[Scorer]) -> None:
        self.filters = list(filters)
        self.scorers = list(scorers)
        self._turn = 0
        """Rotation counter: breaks ties so equal replicas take turns (deterministic)."""

    def pick(self, req: GenerationRequest, replicas: Sequence[ReplicaState]) -> int | None:
        cand = list(range(len(replicas)))
        for f in self.filters:
            cand = f(req, replicas, cand)
            if not cand:
                return None
        scores = normalised_scores(req, replicas, cand, self.scorers)
        return self.choose(cand, scores, len(replicas))

    def choose(self, cand: list[int], scores: list[float], n: int) -> int:
        """Lowest score; among ties, the first at or after the rotation point."""
        best = min(scores)
        tied = [c for c, s in zip(cand, scores, strict=True) if s <= best + 1e-12]
        start = self._turn % max(n, 1)
        self._turn += 1
        return min(tied, key=lambda c: (c - start) % n)


class RoundRobinRouter(PipelineRouter):
    """Healthy replicas in turn, ignoring load (the baseline every paper compares with)."""

    name = "round-robin"

    def __init__(self) -> None:
        super().__init__([healthy_filter], [])
        self._next = 0

    def choose(self, cand: list[int], scores: list[float], n: int) -> int:
        # The first candidate at or after the pointer: an unhealthy replica is skipped
        # without shifting the others' turns.
        pick = min(cand, key=lambda c: (c - self._next) % n)
        self._next = (pick + 1) % n
        return pick


class LeastLoadedRouter(PipelineRouter):
    """Join the shortest queue (JSQ): fewest requests, then least KV in use."""

    name = "least-loaded"

    def __init__(self, kv_weight: float = 0.25) -> None:
        super().__init__(
            [healthy_filter],
            [Scorer("load", load_score, 1.0), Scorer("kv", kv_score, kv_weight)],
        )


class PowerOfTwoRouter(PipelineRouter):
    """Sample two healthy replicas with a seeded RNG, send to the less loaded one.

    Mitzenmacher's power of two choices: close to JSQ with stale load information, without
    herding every request onto the one replica that looked idle at the last scrape.
    """

    name = "power-of-two"

    def __init__(self, seed: int = 0, kv_weight: float = 0.25) -> None:
        super().__init__(
            [healthy_filter],
            [Scorer("load", load_score, 1.0), Scorer("kv", kv_score, kv_weight)],
        )
        self.rng = random.Random(seed)

    def pick(self, req: GenerationRequest, replicas: Sequence[ReplicaState]) -> int | None:
        cand = healthy_filter(req, replicas, list(range(len(replicas))))
        if not cand:
            return None
        if len(cand) > 2:
            cand = sorted(self.rng.sample(cand, 2))
        scores = normalised_scores(req, replicas, cand, self.scorers)
        return self.choose(cand, scores, len(replicas))


class SloAwareRouter(PipelineRouter):
    """Lowest predicted TTFT among the replicas that meet the request's TTFT target."""

    name = "slo-aware"

    def __init__(
        self,
        prefill_s_per_token: float = 1.0e-4,
        decode_s_per_iter: float = 0.02,
        kv_weight: float = 0.25,
    ) -> None:
        estimate = queue_ttft_estimate(prefill_s_per_token, decode_s_per_iter)
        super().__init__(
            [healthy_filter, ttft_slo_filter_factory(estimate)],
            [Scorer("ttft", estimate, 1.0), Scorer("kv", kv_score, kv_weight)],
        )
        self.estimate = estimate
        """The TTFT estimate the router scores with (exposed for admission and tests)."""


RouterFactory = Callable[[int], Router]
"""Makes a fresh router from a seed (routers keep state: rotation pointers, RNGs)."""

_ROUTERS: dict[str, RouterFactory] = {
    "round-robin": lambda seed: RoundRobinRouter(),
    "least-loaded": lambda seed: LeastLoadedRouter(),
    "power-of-two": lambda seed: PowerOfTwoRouter(seed=seed),
    "slo-aware": lambda seed: SloAwareRouter(),
}


def register_router(name: str, factory: RouterFactory) -> None:
    """Add a router under ``name`` (extension point); a name already taken is an error.

    The usual way to write one is a :class:`PipelineRouter` with its own filters and
    weighted scorers, e.g. ``PipelineRouter([healthy_filter], [Scorer("kv", kv_score)])``.
    """
    if name in _ROUTERS:
        raise ConfigError(f"router {name!r} is already registered")
    _ROUTERS[name] = factory


def router_names() -> list[str]:
    """The names :func:`make_router` accepts."""
    return sorted(_ROUTERS)


def make_router(name: str, seed: int = 0) -> Router:
    """A fresh router by name; ``seed`` seeds the randomised ones (``power-of-two``).

    Raises :class:`~sloserve.core.errors.UnknownNameError` listing the valid names.
    """
    try:
        factory = _ROUTERS[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown router {name!r}; choose one of: {', '.join(router_names())}"
        ) from None
    return factory(seed)
