"""The stages a :class:`~sloserve.cluster.routing.PipelineRouter` is built from: filters
(which candidates remain), scorers (a raw cost per candidate) with their min-max
normalised, weighted sum (:func:`normalised_scores`), and pickers (which candidate wins).

Extension point: a new router combines these (or its own functions of the same types,
:data:`Filter`, :data:`ScoreFn`, :data:`Picker`) into a ``PipelineRouter`` and registers
it (:func:`~sloserve.cluster.routing.register_router`). Every name here is importable from
``sloserve.cluster.routing`` too, where they lived before the module was split (the
stages here, the router objects and their registry there).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sloserve.cluster.view import ReplicaStatus, ReplicaView, RouteRequest
from sloserve.core.errors import ConfigError

Filter = Callable[[RouteRequest, list[ReplicaView]], list[ReplicaView]]
"""The candidates that remain for the request."""
ScoreFn = Callable[[RouteRequest, ReplicaView], float]
"""A candidate's raw cost for the request (lower is better), in any unit."""
Picker = Callable[[list[ReplicaView], list[float]], ReplicaView]
"""Chooses one candidate given the weighted normalised scores (same order)."""
ScoreManyFn = Callable[[RouteRequest, Sequence[ReplicaView]], list[float]]
"""Every candidate's raw cost at once (the costs ``fn`` gives one by one, in order)."""


@dataclass(frozen=True, slots=True)
class Scorer:
    """One weighted criterion."""

    name: str
    fn: ScoreFn
    weight: float = 1.0
    many: ScoreManyFn | None = None
    """Optional: the same costs for all candidates in one call, which the pipeline then
    uses instead of ``fn`` (a scorer whose answer shares work across candidates: the
    prefix scorer's, one pass over every replica's cache a decision)."""


def raw_costs(req: RouteRequest, cand: Sequence[ReplicaView], s: Scorer) -> list[float]:
    """The scorer's raw cost of each candidate, in order."""
    if s.many is not None:
        costs = s.many(req, cand)
        if len(costs) != len(cand):  # (a short list would score the rest 0 silently)
            raise ConfigError(
                f"scorer {s.name!r} gave {len(costs)} costs for {len(cand)} candidates"
            )
        return costs
    fn = s.fn
    return [float(fn(req, r)) for r in cand]


# ------------------------------------------------------------------------------ filters


def accepting(req: RouteRequest, cand: list[ReplicaView]) -> list[ReplicaView]:
    """Only replicas that take requests now (UP)."""
    return [r for r in cand if r.status is ReplicaStatus.UP]


def max_outstanding_filter(limit: int) -> Filter:
    """Replicas holding fewer than ``limit`` requests."""

    def below_limit(req: RouteRequest, cand: list[ReplicaView]) -> list[ReplicaView]:
        return [r for r in cand if r.outstanding < limit]

    return below_limit


def ttft_target_filter(estimate: ScoreFn) -> Filter:
    """Replicas whose estimated TTFT meets the request's target (all if none does)."""

    def meets_ttft_target(req: RouteRequest, cand: list[ReplicaView]) -> list[ReplicaView]:
        target = req.slo.ttft_s
        if target is None:
            return cand
        ok = [r for r in cand if estimate(req, r) <= target]
        return ok or cand

    return meets_ttft_target


def sample_filter(rng: random.Random, k: int = 2) -> Filter:
    """A seeded sample of ``k`` candidates (kept in replica order)."""

    def sample(req: RouteRequest, cand: list[ReplicaView]) -> list[ReplicaView]:
        if len(cand) <= k:
            return cand
        idx = sorted(rng.sample(range(len(cand)), k))
        return [cand[i] for i in idx]

    return sample


# ------------------------------------------------------------------------------ scores


def outstanding_score(req: RouteRequest, r: ReplicaView) -> float:
    return float(r.outstanding)


def queued_tokens_score(req: RouteRequest, r: ReplicaView) -> float:
    return float(r.queued_prompt_tokens)


def kv_score(req: RouteRequest, r: ReplicaView) -> float:
    """KV usage (unknown counts as empty: no evidence of pressure)."""
    return 0.0 if math.isnan(r.kv_usage) else r.kv_usage


def ttft_score(req: RouteRequest, r: ReplicaView) -> float:
    """The view's predicted TTFT (none: worst)."""
    p = r.predicted_ttft_s(req)
    return math.inf if p is None else p


def ttft_estimate(prefill_s_per_token: float, decode_s_per_iter: float) -> ScoreFn:
    """The view's predicted TTFT, else a queue estimate (module docstring)."""

    def estimate(req: RouteRequest, r: ReplicaView) -> float:
        p = r.predicted_ttft_s(req)
        if p is not None:
            return p
        ahead = r.queued_prompt_tokens + req.prompt_tokens
        # Engines interleave prefill with the running requests' decode steps: count one
        # iteration per running (or waiting) request as interference.
        return ahead * prefill_s_per_token + (r.running + r.waiting) * decode_s_per_iter

    return estimate


def normalised_scores(
    req: RouteRequest,
    cand: Sequence[ReplicaView],
    scorers: Sequence[Scorer],
    per_scorer: dict[str, list[float]] | None = None,
) -> list[float]:
    """Weighted sum over scorers of min-max normalised costs, one per candidate.

    ``per_scorer`` (decision tracing): filled with each scorer's normalised, unweighted
    score per candidate (all 0 for a scorer that does not decide)."""
    total = [0.0] * len(cand)
    for s in scorers:
        raw = raw_costs(req, cand, s)
        t = sum(raw)
        if t - t == 0.0:  # every cost finite (an inf or a nan makes the sum non-finite)
            # The common case, once over the costs (a router scores every arrival): the
            # very same arithmetic as below, without the finite-cost bookkeeping.
            lo, hi = min(raw), max(raw)
            if lo == hi:
                if per_scorer is not None:
                    per_scorer[s.name] = [0.0] * len(cand)
                continue
            span = hi - lo
            if per_scorer is not None:
                per_scorer[s.name] = [(v - lo) / span for v in raw]
            w = s.weight
            for k, v in enumerate(raw):
                total[k] += w * (v - lo) / span
            continue
        # Some cost is not finite (or the sum overflowed): it counts as the worst.
        finite = [v for v in raw if math.isfinite(v)]
        if not finite or (len(finite) == len(raw) and min(finite) == max(finite)):
            if per_scorer is not None:
                per_scorer[s.name] = [0.0] * len(cand)
            continue
        if per_scorer is not None:
            lo_, span_ = min(finite), max(finite) - min(finite)
            per_scorer[s.name] = [
                1.0 if not math.isfinite(v) else ((v - lo_) / span_ if span_ > 0 else 0.0)
                for v in raw
            ]
        lo, hi = min(finite), max(finite)
        span = hi - lo
        for k, v in enumerate(raw):
            if not math.isfinite(v):
                total[k] += s.weight
            elif span > 0:
                total[k] += s.weight * (v - lo) / span
    return total


# ------------------------------------------------------------------------------ pickers


def first_pick(cand: list[ReplicaView], scores: list[float]) -> ReplicaView:
    return cand[0]


class LowestPick:
    """The lowest-score picker (:func:`lowest_pick`); :meth:`take` is its rotation over
    the tied candidates, which the pipeline's one-scorer path calls directly."""

    __slots__ = ("turn",)

    def __init__(self) -> None:
        self.turn = 0

    def __call__(self, cand: list[ReplicaView], scores: list[float]) -> ReplicaView:
        lim = min(scores) + 1e-12
        return self.take([c for c, s in zip(cand, scores, strict=True) if s <= lim])

    def take(self, tied: list[ReplicaView]) -> ReplicaView:
        pick = tied[self.turn % len(tied)]
        self.turn += 1
        return pick


def lowest_pick() -> Picker:
    """Lowest score; ties are taken in rotation (deterministic)."""
    return LowestPick()


def one_scorer_lowest(
    req: RouteRequest, cand: list[ReplicaView], s: Scorer, picker: LowestPick
) -> ReplicaView | None:
    """The pick of one positively weighted scorer and the lowest picker, in one pass over
    the costs; None (nothing changed) when a cost is not finite. The same pick as
    normalising then picking: the lowest total is 0 (at the lowest cost), so the tied
    candidates are those whose ``weight · (cost − lo) / span`` is at most 1e-12 (the very
    expression the total holds), or all of them when every cost is equal."""
    raw = raw_costs(req, cand, s)
    t = sum(raw)
    if t - t != 0.0:  # an inf or a nan: the general path
        return None
    lo, hi = min(raw), max(raw)
    if lo == hi:
        return picker.take(cand)
    span, w = hi - lo, s.weight
    return picker.take([c for c, v in zip(cand, raw, strict=True) if w * (v - lo) / span <= 1e-12])


def rotation_pick() -> Picker:
    """Per model, the first candidate after the last one picked (an unavailable replica is
    skipped without shifting the others' turns)."""
    last: dict[str, int] = {}

    def rotate(cand: list[ReplicaView], scores: list[float]) -> ReplicaView:
        prev = last.get(cand[0].model, -1)
        nxt = next((c for c in cand if c.replica_id > prev), cand[0])
        last[nxt.model] = nxt.replica_id
        return nxt

    return rotate


def random_pick(rng: random.Random) -> Picker:
    def draw(cand: list[ReplicaView], scores: list[float]) -> ReplicaView:
        return cand[rng.randrange(len(cand))]

    return draw
