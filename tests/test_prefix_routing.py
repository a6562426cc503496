"""Cache-aware routers (cluster/prefix_routing.py): hand-built views, the approximate
index, session stickiness, and a cluster on the Mooncake trace (FAST '25, Apache-2.0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sloserve.cluster.prefix_routing import PrefixRouter, _chain, text_block_ids
from sloserve.cluster.routing import Hold, make_router, router_names
from sloserve.cluster.view import ClusterView, ReplicaStatus, RouteRequest, StaticReplica
from sloserve.core.errors import ConfigError

TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"


def rr(ids: tuple[int, ...] | None = (1, 2, 3, 4), prompt: int = 2048) -> RouteRequest:
    return RouteRequest(0, "default", prompt, hash_ids=ids)


def test_the_cache_aware_routers_are_registered() -> None:
    assert {"prefix-affinity", "prefix-load", "session-affinity"} <= set(router_names())
    with pytest.raises(ConfigError, match="mode"):
        make_router("prefix-affinity", {"mode": "psychic"})


def test_prefix_affinity_prefers_the_cached_prefix_then_the_least_loaded() -> None:
    view = ClusterView(
        [
            StaticReplica(0, outstanding=1, cached_tokens=0),
            StaticReplica(1, outstanding=9, cached_tokens=1536),
            StaticReplica(2, outstanding=3, cached_tokens=512),
        ]
    )
    assert make_router("prefix-affinity").route(rr(), view) == 1
    # No hit anywhere: load decides.
    none = ClusterView(
        [StaticReplica(i, outstanding=o, cached_tokens=0) for i, o in enumerate((4, 2, 7))]
    )
    assert make_router("prefix-affinity").route(rr(), none) == 1
    # A request without prompt identity: load only.
    assert make_router("prefix-affinity").route(rr(None), view) == 0


def test_prefix_load_trades_overlap_against_load_by_weights() -> None:
    view = ClusterView(
        [
            StaticReplica(0, outstanding=10, cached_tokens=1843),
            StaticReplica(1, outstanding=0, cached_tokens=0),
        ]
    )
    assert (
        make_router("prefix-load", {"prefix_weight": 2.0, "load_weight": 1.0}).route(rr(), view)
        == 0
    )
    assert (
        make_router("prefix-load", {"prefix_weight": 1.0, "load_weight": 2.0}).route(rr(), view)
        == 1
    )


def test_approximate_mode_remembers_where_it_sent_each_prefix() -> None:
    router = make_router("prefix-affinity", {"mode": "approximate"})
    view = ClusterView([StaticReplica(i) for i in range(4)])
    first = router.route(rr((1, 2, 3, 4)), view)
    assert router.route(rr((1, 2, 3, 4, 5)), view) == first  # the same conversation
    other = router.route(rr((9, 8)), view)
    assert other != first  # no shared prefix: the rotation among equals moves on
    # The exact mode asks the replicas instead; a view that does not know (None) falls
    # back to the router's own index.
    exact = make_router("prefix-affinity")
    unknown = ClusterView([StaticReplica(i, cached_tokens=None) for i in range(4)])
    a = exact.route(rr((5, 6)), unknown)
    assert exact.route(rr((5, 6, 7)), unknown) == a


def test_exact_mode_records_only_for_the_replicas_whose_view_does_not_know() -> None:
    # Replicas 0 and 1 cannot tell their cache (None), 2 and 3 can: the router's own index
    # is read, and so written, only for 0 and 1.
    router = make_router("prefix-affinity")
    assert isinstance(router, PrefixRouter)
    view = ClusterView(
        [StaticReplica(i, cached_tokens=None if i < 2 else 0) for i in range(4)]
    )
    picks = [router.route(rr((7, 8, k)), view) for k in range(4)]
    # The first goes by rotation among equals (0); those sharing its prefix follow it.
    assert picks == [0, 0, 0, 0]
    busy = ClusterView(
        [StaticReplica(i, cached_tokens=None if i < 2 else 0, outstanding=9 * (i < 2))
         for i in range(4)]
    )  # fmt: skip
    to = router.route(rr((5, 6)), busy)  # no prefix anywhere: the least loaded, 2 or 3
    assert to in (2, 3)
    assert router.index.matched(to, _chain((5, 6))) == 0  # never read for it: not kept
    assert router.index.matched(0, _chain((7, 8, 3))) == 3


def test_session_affinity_sticks_until_the_replica_goes_away() -> None:
    router = make_router("session-affinity")
    view = ClusterView([StaticReplica(0, outstanding=5), StaticReplica(1, outstanding=1)])
    assert router.route(rr((7, 8, 1)), view) == 1
    busy = ClusterView([StaticReplica(0, outstanding=0), StaticReplica(1, outstanding=50)])
    assert router.route(rr((7, 8, 2, 3)), busy) == 1  # same session (first two blocks)
    assert router.route(rr((7, 9)), busy) == 0  # another session goes by load
    gone = ClusterView(
        [StaticReplica(0, outstanding=3), StaticReplica(1, status=ReplicaStatus.FAILED)]
    )
    assert router.route(rr((7, 8, 4)), gone) == 0
    assert isinstance(
        router.route(rr((7, 8)), ClusterView([StaticReplica(0, status=ReplicaStatus.FAILED)])), Hold
    )


def test_text_block_ids_hash_full_chunks_stably() -> None:
    text = "x" * 256 + "y" * 256 + "z" * 100
    ids = text_block_ids(text)
    assert len(ids) == 2 and ids == text_block_ids(text)  # the partial chunk has none
    assert text_block_ids("x" * 256 + "q" * 256)[0] == ids[0] != ids[1]
    assert all(0 <= i < 2**63 for i in ids)


@pytest.mark.skipif(
    not (TRACE / "mooncake_synthetic_trace.jsonl").exists(), reason="no shared traces"
)
def test_prefix_aware_routing_beats_round_robin_on_hit_rate_on_a_real_trace() -> None:
    import sloserve

    out = {}
    for router in ("round-robin", "prefix-affinity", "session-affinity"):
        cfg = {
            "workload": {
                "trace": str(TRACE / "mooncake_synthetic_trace.jsonl"),
            },
            "policy": "sarathi",
            # A small cache (128k tokens) so that units are evicted too.
            "instance": {"profile": "llama-3.1-8b@h100", "kv_capacity_tokens": 131072},
            "cluster": {"replicas": [{"count": 8}], "router": router},
        }
        out[router] = sloserve.simulate(cfg).summary
    rr_hit = out["round-robin"]["prefix_hit_rate"]
    # Measured: 0.020, 0.140 and 0.104 (8 replicas of 128k tokens, the whole trace).
    assert out["prefix-affinity"]["prefix_hit_rate"] > 4 * rr_hit
    assert out["session-affinity"]["prefix_hit_rate"] > 4 * rr_hit
    assert out["prefix-affinity"]["ttft_p50"] < out["round-robin"]["ttft_p50"]
    assert all(s["finished"] == out["round-robin"]["finished"] for s in out.values())


@pytest.mark.skipif(
    not (TRACE / "mooncake_synthetic_trace.jsonl").exists(), reason="no shared traces"
)
def test_cut_runs_keep_the_prefix_cache_consistent_in_a_cluster() -> None:
    # Prefix-affinity lets replicas fast-forward and cuts their runs when a request
    # arrives (the KV manager shrinks and un-registers cut units): the KV invariants are
    # checked after every decision, with a tiny cache so that units churn.
    import sloserve

    cfg = {
        "workload": {
            "trace": str(TRACE / "mooncake_synthetic_trace.jsonl"),
            "replay": {"end_s": 40},
            "max_context": 40000,
        },
        "policy": "sarathi",
        "instance": {"profile": "llama-3.1-8b@h100", "kv_capacity_tokens": 49152},
        "cluster": {"replicas": [{"count": 3}], "router": "prefix-affinity"},
    }
    s = sloserve.simulate(cfg, check_invariants=True).summary
    assert s["prefix_evicted_units"] > 0 and s["prefill_tokens_saved"] > 0
