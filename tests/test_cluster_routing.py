"""Each cluster router's pick on hand-built views (golden), holds, and the registry."""

from __future__ import annotations

import pytest

from sloserve.cluster import (
    ClusterView,
    Hold,
    ReplicaStatus,
    RouteRequest,
    StaticReplica,
    make_router,
    register_router,
    router_names,
)
from sloserve.core.errors import ConfigError, UnknownNameError
from sloserve.core.request import SLO

UP, FAILED = ReplicaStatus.UP, ReplicaStatus.FAILED


def view() -> ClusterView:
    return ClusterView(
        [
            StaticReplica(
                0, "a", UP, outstanding=5, queued_prompt_tokens=900, kv_usage=0.9, ttft_s=2.0
            ),
            StaticReplica(
                1, "a", UP, outstanding=2, queued_prompt_tokens=4000, kv_usage=0.5, ttft_s=0.4
            ),
            StaticReplica(
                2, "a", FAILED, outstanding=0, queued_prompt_tokens=0, kv_usage=0.0, ttft_s=0.0
            ),
            StaticReplica(
                3, "a", UP, outstanding=3, queued_prompt_tokens=100, kv_usage=0.2, ttft_s=0.9
            ),
            StaticReplica(
                4, "b", UP, outstanding=0, queued_prompt_tokens=0, kv_usage=0.0, ttft_s=0.0
            ),
        ]
    )


REQ = RouteRequest(req_id=1, model="a", prompt_tokens=100, slo=SLO(ttft_s=1.0))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("pass-through", 0),
        ("least-outstanding", 1),
        ("jsq-tokens", 3),
        ("least-kv", 3),
        ("slo-aware", 1),
    ],
)
def test_golden_pick(name: str, expected: int) -> None:
    assert make_router(name).route(REQ, view()) == expected


def test_round_robin_skips_failed_and_other_models() -> None:
    r = make_router("round-robin")
    assert [r.route(REQ, view()) for _ in range(4)] == [0, 1, 3, 0]


def test_random_and_power_of_two_are_seeded_and_stay_in_candidates() -> None:
    for name in ("random", "power-of-two"):
        a = [make_router(name, seed=5).route(REQ, view()) for _ in range(1)]
        r1, r2 = make_router(name, seed=5), make_router(name, seed=5)
        seq1 = [r1.route(REQ, view()) for _ in range(20)]
        seq2 = [r2.route(REQ, view()) for _ in range(20)]
        assert seq1 == seq2 and a[0] == seq1[0]
        assert set(seq1) <= {0, 1, 3}
    # power-of-two picks the less loaded of its two samples: never the most loaded (0)
    # when 0 is paired with anything else
    p2 = make_router("power-of-two", seed=1)
    assert 0 not in {p2.route(REQ, view()) for _ in range(50)}


def test_slo_aware_keeps_all_when_none_meets_the_target() -> None:
    tight = RouteRequest(req_id=2, model="a", prompt_tokens=10, slo=SLO(ttft_s=0.01))
    assert make_router("slo-aware").route(tight, view()) == 1  # still the lowest TTFT


def test_model_routing_and_holds() -> None:
    b = RouteRequest(req_id=3, model="b", prompt_tokens=10)
    assert make_router("least-outstanding").route(b, view()) == 4
    none = RouteRequest(req_id=4, model="c", prompt_tokens=10)
    assert make_router("least-outstanding").route(none, view()) == Hold("no_replica")
    capped = make_router("least-outstanding", {"max_outstanding": 2})
    assert capped.route(REQ, view()) == Hold("max_outstanding")
    assert make_router("least-outstanding", {"max_outstanding": 3}).route(REQ, view()) == 1


def test_ties_rotate() -> None:
    v = ClusterView([StaticReplica(i, "a", UP) for i in range(3)])
    r = make_router("least-outstanding")
    assert [r.route(REQ, v) for _ in range(4)] == [0, 1, 2, 0]


def test_registry_fails_loudly() -> None:
    with pytest.raises(UnknownNameError, match="least-outstanding"):
        make_router("least-outstandin")
    with pytest.raises(ConfigError, match="max_outstanding"):
        make_router("least-outstanding", {"max_outstandin": 3})
    with pytest.raises(ConfigError, match="already registered"):
        register_router("random", lambda seed: make_router("random"), "dup")
    assert {
        "pass-through",
        "random",
        "round-robin",
        "least-outstanding",
        "jsq-tokens",
        "power-of-two",
        "least-kv",
        "slo-aware",
    } <= set(router_names())
