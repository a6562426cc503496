"""The pipeline router's one-scorer path (one positively weighted scorer and the lowest
picker: least-outstanding, least-kv) picks what normalising then picking picks, its
rotation over tied candidates included."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.cluster.routing import (
    Hold,
    PipelineRouter,
    Scorer,
    kv_score,
    lowest_pick,
    normalised_scores,
    outstanding_score,
)
from sloserve.cluster.view import ClusterView, ReplicaStatus, RouteRequest, StaticReplica

STATUS = st.sampled_from([ReplicaStatus.UP, ReplicaStatus.UP, ReplicaStatus.FAILED])
COST = st.one_of(
    st.integers(0, 6).map(float),
    st.floats(0.0, 1.0, allow_nan=False),
    st.sampled_from([math.inf, math.nan, 1e300, -1e300, 0.0, -0.0]),
)


def general(router: PipelineRouter, req: RouteRequest, view: ClusterView, turn: list[int]) -> int:
    """Normalise, then the lowest picker's rule (the path before the one-scorer one)."""
    cand = [r for r in view.serving(req.model) if r.status is ReplicaStatus.UP]
    scores = normalised_scores(req, cand, router.scorers)
    lim = min(scores) + 1e-12
    tied = [c for c, s in zip(cand, scores, strict=True) if s <= lim]
    pick = tied[turn[0] % len(tied)]
    turn[0] += 1
    return pick.replica_id


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(STATUS, st.integers(0, 6), COST), min_size=1, max_size=9),
    st.sampled_from([0.25, 1.0, 3.0]),
    st.integers(1, 6),
)
def test_one_scorer_path_picks_as_the_general_path(
    reps: list[tuple[ReplicaStatus, int, float]], weight: float, rounds: int
) -> None:
    view = ClusterView(
        StaticReplica(i, status=s, outstanding=o, kv_usage=k) for i, (s, o, k) in enumerate(reps)
    )
    req = RouteRequest(0, "default", 10)
    for score in (outstanding_score, kv_score):
        router = PipelineRouter("t", [], [Scorer("s", score, weight)], lowest_pick())
        turn = [0]
        if not any(s is ReplicaStatus.UP for s, _, _ in reps):
            continue
        for _ in range(rounds):  # the rotation advances alike
            assert router.route(req, view) == general(router, req, view, turn)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(STATUS, st.integers(0, 10**12)), min_size=1, max_size=9),
    st.sampled_from([1e-15, 1e-9, 1e-3, 1.0, 7.0]),
    st.integers(1, 6),
)
def test_least_outstanding_pick_is_the_general_pick_at_any_weight_and_count(
    reps: list[tuple[ReplicaStatus, int]], weight: float, rounds: int
) -> None:
    """Outstanding counts are integers: the least-outstanding path ties only the lowest
    counts, and hands the decision to the general path where a tiny weight over a wide span
    of counts would tie others too (``w · Δ / span <= 1e-12``)."""
    view = ClusterView(StaticReplica(i, status=s, outstanding=o) for i, (s, o) in enumerate(reps))
    req = RouteRequest(0, "default", 10)
    router = PipelineRouter("t", [], [Scorer("s", outstanding_score, weight)], lowest_pick())
    turn = [0]
    for _ in range(rounds):
        if not any(s is ReplicaStatus.UP for s, _ in reps):
            assert router.route(req, view) == Hold("no_replica")
            continue
        assert router.route(req, view) == general(router, req, view, turn)
