"""``ClusterView.serving("default")`` when no replica serves "default": every replica,
built once and rebuilt when a replica joins (it ran once per arrival as a new list)."""

from __future__ import annotations

from sloserve.cluster.view import ClusterView, StaticReplica


def test_default_is_every_replica_and_follows_joins() -> None:
    view = ClusterView([StaticReplica(0, model="a"), StaticReplica(1, model="b")])
    first = view.serving("default")
    assert [r.replica_id for r in first] == [0, 1]
    assert view.serving("default") is first  # not rebuilt per call
    view.add(StaticReplica(2, model="a"))
    assert [r.replica_id for r in view.serving("default")] == [0, 1, 2]
    assert [r.replica_id for r in view.serving("a")] == [0, 2]
    assert list(view.serving("c")) == []


def test_a_replica_serving_default_takes_those_requests() -> None:
    view = ClusterView([StaticReplica(0, model="a"), StaticReplica(1, model="default")])
    assert [r.replica_id for r in view.serving("default")] == [1]
