"""QLM's two-stage warm start (``papers/qlm.txt`` §5: storage → CPU memory while a model
waits in the virtual queue, then CPU → GPU): a change to a model still being read costs
only what the read leaves, a busy replica serves on while the read goes on, and a new
group is priced where it is placed (``cluster/qlm/changes.py``, ``placement.py``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sloserve.cluster.qlm import make_qlm_router
from sloserve.cluster.qlm.changes import change_cost, reads_ahead
from sloserve.cluster.qlm.hooks import QLMHooks
from sloserve.cluster.qlm.placement import best_tail, insert_at, place
from sloserve.cluster.qlm.router import NOMINAL_PROFILE, QLMRouter
from sloserve.cluster.qlm.warm import GIB, CPUMemory
from sloserve.cluster.view import ReplicaStatus, RouteRequest
from sloserve.core.request import SLO

COLD = {"a": 0.0, "b": 12.0}
"""Replica 0 serves ``a``; ``b`` loads cold in 12 s: a 10 s read (10 GB at 1 GB/s) and
2 s from CPU memory."""


def _router(lsos: str = "pull,balance,warm-start") -> QLMRouter:
    qr = make_qlm_router("qlm", disk_gb_per_s=1.0, lsos=lsos)
    assert isinstance(qr, QLMRouter)
    qr.bind(
        QLMHooks(
            lambda _i: None, lambda _r: NOMINAL_PROFILE, lambda _r, m: COLD[m],
            weight_bytes=lambda _m: 10e9,
        )
    )  # fmt: skip
    return qr


def _reading(qr: QLMRouter) -> None:
    """Replica 0's CPU memory reads ``b`` from 0 to 10 s."""
    qr.cpu_mem[0] = m = CPUMemory(100 * GIB, 1e9)
    m.update(["b"], "a", lambda _m: 10e9, 0.0)
    assert m.read_end("b", 0.0) == 10.0


def test_a_change_to_a_model_being_read_costs_the_rest_of_the_read_plus_the_copy() -> None:
    qr = _router()
    full = qr._swap(0, "b")  # drain + the cold load
    drain = full - 12.0
    assert drain > 0
    assert change_cost(qr, 0, "b", 0.0, 0.0) == full  # no read: as priced before
    _reading(qr)
    # begun now: the load ends with the read (10 s) or the drain, then 2 s from CPU memory
    assert change_cost(qr, 0, "b", 0.0, 0.0) == pytest.approx(min(full, max(drain, 10.0) + 2))
    # begun after 9 s of other work: only what is left of the read, or the drain
    assert change_cost(qr, 0, "b", 0.0, 9.0) == pytest.approx(max(9 + drain, 10.0) + 2 - 9)
    # begun after the read: the drain and a warm load
    assert change_cost(qr, 0, "b", 0.0, 30.0) == pytest.approx(drain + 2.0)
    # never more than the cold price
    assert change_cost(qr, 0, "b", 0.0, 0.0) <= full
    off = _router("pull,balance")  # without the warm-start LSO nothing is read
    off.cpu_mem[0] = qr.cpu_mem[0]
    assert change_cost(off, 0, "b", 0.0, 9.0) == full


def test_a_replica_keeps_its_model_while_its_next_model_is_read() -> None:
    qr = _router()
    head: Any = SimpleNamespace(model="b")
    v: Any = SimpleNamespace(replica_id=0, model="a", outstanding=3, status=ReplicaStatus.UP)
    assert not reads_ahead(qr, v, head, 0.0)  # nothing read: no reason to wait
    qr.cpu_mem[0] = m = CPUMemory(200 * GIB, 1e9)
    m.update(["b"], "a", lambda _m: 100e9, 0.0)  # a 100 s read (a 70B model at 1 GB/s)
    drain = qr._swap(0, "b") - 12.0
    assert 0 < drain < 50
    assert reads_ahead(qr, v, head, 0.0)  # the read ends at 100 s: keep serving a
    assert reads_ahead(qr, v, head, 100.0 - drain - 1.5)
    # the change begins once its drain (and a tick) would end by the read's end
    assert not reads_ahead(qr, v, head, 100.0 - drain - 1.0)
    empty: Any = SimpleNamespace(replica_id=0, model="a", outstanding=0, status=ReplicaStatus.UP)
    assert reads_ahead(qr, empty, head, 0.0)  # idle too: requests of ``a`` may come
    cold = _router("pull,balance")  # without the warm-start LSO: no read to wait for
    cold.cpu_mem[0] = m
    assert not reads_ahead(cold, v, head, 0.0)


def _group(qr: QLMRouter, i: int, model: str) -> Any:
    return qr.table.add(RouteRequest(i, model, 200, 0.0, SLO(deadline_s=300.0)))


def test_a_new_group_is_priced_where_it_is_placed() -> None:
    """A replica serving ``a`` with a group of ``b`` queued: a new group of ``a`` goes to
    the head (``place``), so its price has neither ``b``'s work nor two model changes."""
    qr = _router()
    gb = _group(qr, 1, "b")
    qr.vq[0] = [gb.group_id]
    ga = _group(qr, 2, "a")
    assert insert_at(qr, qr.vq[0], "a", "a") == 0
    assert insert_at(qr, qr.vq[0], "b", "a") == 1  # behind its model's last group
    assert insert_at(qr, qr.vq[0], "c", "a") == 1  # no group of it, not served: the tail
    v: Any = SimpleNamespace(replica_id=0, model="a", outstanding=0, status=ReplicaStatus.UP,
                             capacity=8)  # fmt: skip
    rid, _, mean = best_tail(qr, ga, [v], 0.0)
    own = qr.rct.completion(ga, NOMINAL_PROFILE)[0]
    assert rid == 0 and mean == pytest.approx(own)  # at the head: nothing ahead of it
    place(qr, ga, 0, "a")
    assert qr.vq[0] == [ga.group_id, gb.group_id]


def test_a_queue_is_scored_with_the_change_cost_while_its_next_model_is_read() -> None:
    """``queue_score`` (behind ``keep_model``'s "own groups first", Insight #3) prices the
    change to ``b`` after ``a``'s group with :func:`change_cost`: the read of ``b`` goes on
    meanwhile, so the change costs only what the read leaves plus the copy, not the cold
    load (``_swap``) it would cost with no read."""
    from sloserve.cluster.qlm.changes import queue_score

    qr = _router()
    ga, gb = _group(qr, 1, "a"), _group(qr, 2, "b")
    v: Any = SimpleNamespace(replica_id=0, model="a", outstanding=0, status=ReplicaStatus.UP,
                             capacity=8)  # fmt: skip
    hw = NOMINAL_PROFILE

    def expected(cost_b: float) -> float:
        """The α-quantile completions of ``a`` then ``b`` (Eq. 10) with ``b``'s change
        costing ``cost_b``."""
        m, var = qr._ready(v, 0.0)
        ca, cva = qr.rct.completion(ga, hw)
        wa, wva = qr.rct.work(ga, hw)
        cb, cvb = qr.rct.completion(gb, hw)
        done_a = qr.rct.quantile(m + ca, var + cva)
        done_b = qr.rct.quantile(m + wa + cost_b + cb, var + wva + cvb)
        return done_a + done_b

    order = [ga.group_id, gb.group_id]
    wa = qr.rct.work(ga, hw)[0] + qr._ready(v, 0.0)[0]
    assert queue_score(qr, v, order, 0.0)[1] == pytest.approx(expected(qr._swap(0, "b")))
    _reading(qr)  # b is read from 0 to 10 s: the change after a costs less
    cost = change_cost(qr, 0, "b", 0.0, wa)
    assert cost < qr._swap(0, "b") - 1.0
    assert queue_score(qr, v, order, 0.0)[1] == pytest.approx(expected(cost))
