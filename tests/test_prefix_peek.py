"""A router's peek at every candidate's prefix cache in one call a decision
(``view.cached_prefix_tokens_all``, ``SimReplicaView.cached_prefix_tokens_many``,
``engine/prefix_peek.py``): the same answers as asking each view, the same picks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from sloserve.cluster.prefix_routing import PrefixRouter
from sloserve.cluster.replica import SimReplicaView
from sloserve.cluster.routing import make_router, route_explained
from sloserve.cluster.view import (
    ClusterView,
    ReplicaView,
    RouteRequest,
    StaticReplica,
    cached_prefix_tokens_all,
)
from sloserve.engine.kv import PagedKVManager
from sloserve.engine.prefix_cache import PrefixCachingKVManager
from sloserve.engine.prefix_peek import peek_many

TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"


def rr(ids: tuple[int, ...] | None = (1, 2, 3, 4), prompt: int = 2048) -> RouteRequest:
    return RouteRequest(0, "default", prompt, hash_ids=ids)


_CALLS: list[int] = []  # the views each call of _Batched's answer for many was asked for


class _Batched(StaticReplica):
    """A view class that answers for many views at once (counting its calls)."""

    @staticmethod
    def cached_prefix_tokens_many(
        req: RouteRequest, views: Sequence[ReplicaView]
    ) -> list[int | None]:
        _CALLS.append(len(views))
        return [v.cached_prefix_tokens(req) for v in views]


def test_all_answers_come_from_the_class_only_when_every_candidate_is_of_it() -> None:
    _CALLS.clear()
    same = [_Batched(0, cached_tokens=512), _Batched(1, cached_tokens=0)]
    assert cached_prefix_tokens_all(rr(), same) == [512, 0]
    assert _CALLS == [2]
    mixed: list[ReplicaView] = [_Batched(0, cached_tokens=512), StaticReplica(1)]
    assert cached_prefix_tokens_all(rr(), mixed) == [512, None]  # asked one by one
    assert _CALLS == [2]
    assert cached_prefix_tokens_all(rr(), []) == []


def test_the_prefix_scorers_costs_at_once_equal_those_one_by_one() -> None:
    # A view answering None (a gateway's upstream) goes by the router's own index, as one
    # by one; load ties and the request without identity too.
    views: list[ReplicaView] = [
        StaticReplica(0, outstanding=1, cached_tokens=0),
        StaticReplica(1, outstanding=9, cached_tokens=1536),
        StaticReplica(2, outstanding=3, cached_tokens=None),
        StaticReplica(3, outstanding=3, cached_tokens=4096),
    ]
    for mode in ("exact", "approximate"):
        router = make_router("prefix-affinity", {"mode": mode})
        assert isinstance(router, PrefixRouter)
        prefix = router.scorers[0]
        assert prefix.name == "prefix" and prefix.many is not None
        for req in (rr(), rr(None), rr((1, 2)), rr(prompt=100)):
            router.route(req, ClusterView(views))  # records index entries (approximate)
            one = [prefix.fn(req, v) for v in views]
            assert prefix.many(req, views) == one


def test_decisions_and_their_explanations_are_those_of_the_scorer_one_by_one() -> None:
    # The same router with its prefix scorer's ``many`` dropped asks one view at a time:
    # every decision, its normalised scores and totals (decision tracing) are equal.
    batched, single = make_router("prefix-load"), make_router("prefix-load")
    assert isinstance(single, PrefixRouter)
    single.scorers[0] = dataclasses.replace(single.scorers[0], many=None)
    views = ClusterView(
        [StaticReplica(i, outstanding=(3 * i) % 5, cached_tokens=512 * i) for i in range(5)]
    )
    for k in range(6):
        req = rr(prompt=512 * (k + 1)) if k % 3 else rr(None)
        assert route_explained(batched, req, views) == route_explained(single, req, views)
        assert batched.route(req, views) == single.route(req, views)


def test_plain_managers_and_missing_engines_have_nothing_cached() -> None:
    cache = PrefixCachingKVManager(64, 4, 8, source_block_tokens=8)
    assert peek_many([PagedKVManager(64, 4), None, cache], (1, 2, 3), 24) == [0, 0, 0]
    assert peek_many([cache], (), 24) == [0]


@pytest.mark.skipif(
    not (TRACE / "mooncake_synthetic_trace.jsonl").exists(), reason="no shared traces"
)
@pytest.mark.parametrize("cpu_gib", [0.0, 2.0])
def test_a_cluster_run_asks_once_a_decision_and_gets_each_views_answer(
    cpu_gib: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At every decision of a prefix-affinity run (a small cache that evicts, with and
    # without a CPU tier), the answers for all candidates at once are each view's own.
    import sloserve

    batched = SimReplicaView.cached_prefix_tokens_many
    seen: list[tuple[int | None, ...]] = []

    def checked(req: RouteRequest, views: Sequence[SimReplicaView]) -> Sequence[int | None]:
        got = batched(req, views)
        assert list(got) == [v.cached_prefix_tokens(req) for v in views]
        seen.append(tuple(got))
        return got

    monkeypatch.setattr(SimReplicaView, "cached_prefix_tokens_many", staticmethod(checked))
    cfg = {
        "workload": {
            "trace": str(TRACE / "mooncake_synthetic_trace.jsonl"),
            "replay": {"end_s": 60},
            "max_context": 40000,
        },
        "policy": "sarathi",
        "instance": {
            "profile": "llama-3.1-8b@h100",
            "kv_capacity_tokens": 49152,
            "prefix_caching": True,
            "cpu_cache_gib": cpu_gib,
        },
        "cluster": {"replicas": [{"count": 3}], "router": "prefix-affinity"},
    }
    s = sloserve.simulate(cfg).summary
    assert len(seen) > 0
    assert any(any(a for a in answers) for answers in seen)  # some prefixes were found
    assert s["prefix_evicted_units"] > 0
    assert (s["prefix_hit_tokens_cpu"] > 0) == (cpu_gib > 0)  # the CPU tier answered too
