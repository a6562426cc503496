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


def _cache_holding(
    unit_tokens: int, prompt_ids: tuple[int, ...], prompt: int
) -> PrefixCachingKVManager:
    """A caching manager of ``unit_tokens`` (4-token blocks) that has computed and
    released a prompt of ``prompt`` tokens (its units stay cached, unreferenced)."""
    from sloserve.core.request import Request

    cache = PrefixCachingKVManager(512, 4, unit_tokens, source_block_tokens=64)
    req = Request(1, 0.0, prompt, 4, hash_ids=prompt_ids)
    cache.lookup_prefix(req)
    assert cache.allocate(1, prompt) is not None
    req.num_computed_tokens = prompt
    cache.retired([(req, prompt)])
    cache.free(1)
    return cache


def test_replicas_of_other_unit_sizes_get_their_own_keys() -> None:
    # Keys depend on the unit size: a list mixing sizes is answered per size, each answer
    # the replica's own peek (a peek reusing the first size's keys answers 0 for the rest).
    ids, prompt = (11, 12, 13, 14), 256
    kvs = [_cache_holding(u, ids, prompt) for u in (64, 128, 64)]
    own = [kv.peek_prefix(ids, prompt) for kv in kvs]
    assert own == [256, 256, 256]
    assert peek_many(kvs, ids, prompt) == own


def test_a_subclass_of_the_caching_manager_answers_itself() -> None:
    class Blind(PrefixCachingKVManager):
        def peek_prefix(self, hash_ids: Sequence[int], prompt_tokens: int) -> int:
            return 0

    cache = _cache_holding(64, (11, 12), 128)
    blind = Blind(512, 4, 64, source_block_tokens=64)
    assert peek_many([cache, blind], (11, 12), 128) == [128, 0]


def test_a_view_class_overriding_the_single_answer_is_asked_one_by_one() -> None:
    # An inherited batch answer would bypass the subclass's own cached_prefix_tokens.
    class Own(_Batched):
        def cached_prefix_tokens(self, req: RouteRequest) -> int | None:
            return 7

    class Both(Own):
        @staticmethod
        def cached_prefix_tokens_many(
            req: RouteRequest, views: Sequence[ReplicaView]
        ) -> list[int | None]:
            return [8 for _ in views]

    _CALLS.clear()
    assert cached_prefix_tokens_all(rr(), [Own(0), Own(1)]) == [7, 7]
    assert _CALLS == []
    assert cached_prefix_tokens_all(rr(), [Both(0), Both(1)]) == [8, 8]  # its own batch


def test_a_scorer_giving_too_few_or_too_many_costs_is_an_error() -> None:
    from sloserve.cluster.route_stages import Scorer, raw_costs
    from sloserve.core.errors import ConfigError

    views = [StaticReplica(i) for i in range(3)]
    for n in (2, 4):
        s = Scorer("short", lambda q, r: 0.0, many=lambda q, c, n=n: [0.0] * n)
        with pytest.raises(ConfigError, match="scorer 'short' gave"):
            raw_costs(rr(), views, s)
