"""Where QLM puts a request group, split from ``router.py`` (one concept: placement, the
load-balancing LSO of ``papers/qlm.txt`` §5, and the re-planning trigger that prices a
virtual queue in place, §4/§7).

- :func:`best_tail`: a new group goes to the tail of the replica where its α-quantile
  completion is earliest, preferring replicas that serve (or are changing to) its model
  and meet its deadline (Insight #3: no model change a deadline does not need).
- :func:`place`: it joins behind the last group of its model in that queue.
- :func:`violation_ahead`: the RCT estimator's check that calls the plan generator.

Functions of a :class:`~sloserve.cluster.qlm.router.QLMRouter` (as ``changes.py``'s): they
read its virtual queues, estimator and pricing, and write only ``vq`` and ``_assign``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sloserve.cluster.qlm.groups import RequestGroup
from sloserve.cluster.view import ClusterView, ReplicaView

if TYPE_CHECKING:
    from sloserve.cluster.qlm.router import QLMRouter


def place(qr: QLMRouter, g: RequestGroup, rid: int, model: str | None = None) -> None:
    """Insight #3: a new group joins right behind the last group of its model in the
    queue (or at the head when the replica serves its model and no group of it is
    queued), so same-model groups stay together and the replica does not thrash;
    else at the tail. ``model``: the replica's current model."""
    qr._assign[g.group_id] = rid
    q = qr.vq.setdefault(rid, [])
    q.insert(insert_at(qr, q, g.model, model), g.group_id)


def insert_at(qr: QLMRouter, q: Sequence[int], g_model: str, model: str | None) -> int:
    """Where :func:`place` puts a group of ``g_model`` in the queue ``q`` of a replica
    whose current model is ``model``: right behind the last group of its model, at the head
    when the replica serves its model and none is queued, else at the tail."""
    for k in range(len(q) - 1, -1, -1):
        h = qr.table.groups.get(q[k])
        if h is not None and h.model == g_model:
            return k + 1
    return 0 if model == g_model else len(q)


def violation_ahead(qr: QLMRouter, view: ClusterView, rid: int) -> bool:
    """The re-planning trigger (§4, §7: "invoked by the RCT estimator when an SLO
    violation is likely"): a group of replica ``rid``'s virtual queue whose α-quantile
    completion at its place misses its deadline, where at the head of the queue it
    would meet it (a group that misses even there cannot be saved by a new plan)."""
    v = view.replica(rid)
    m, var = qr._ready(v, view.now)
    hw, model = qr._hw(rid), qr._changing.get(rid, v.model)
    for gid in qr.vq.get(rid, []):
        g = qr.table.groups.get(gid)
        if g is None:
            continue
        swap = qr._swap(rid, g.model) if g.model != model else 0.0
        m, model = m + swap, g.model
        cm, cv = qr.rct.completion(g, hw)
        if view.now + qr.rct.quantile(m + cm, var + cv) > g.deadline:
            r0, v0 = qr._ready(v, view.now)
            now_model = qr._changing.get(rid, v.model)
            head = swap + r0 + cm if g.model != now_model else r0 + cm
            if view.now + qr.rct.quantile(head, v0 + cv) <= g.deadline:
                return True
        w, wv = qr.rct.work(g, hw)
        m, var = m + w, var + wv
    return False


def tail(
    qr: QLMRouter, v: ReplicaView, now: float, upto: int | None = None
) -> tuple[float, float, str]:
    """(mean, var) seconds until replica ``v``'s virtual queue is done (its first ``upto``
    groups: all by default), and the model it then serves."""
    m, var = qr._ready(v, now)
    # a replica changing model is priced with its new one (its load is in _ready)
    hw, model = qr._hw(v.replica_id), qr._changing.get(v.replica_id, v.model)
    for gid in qr.vq.get(v.replica_id, [])[:upto]:
        g = qr.table.groups.get(gid)
        if g is None:
            continue
        if g.model != model:
            m += qr._swap(v.replica_id, g.model)
            model = g.model
        w, wv = qr.rct.work(g, hw)
        m, var = m + w, var + wv
    return m, var, model


def best_tail(
    qr: QLMRouter, g: RequestGroup, live: Sequence[ReplicaView], now: float
) -> tuple[int, float, float]:
    """Where a new group goes: among the replicas that serve (or will serve) its model
    and meet its deadline at level α, the earliest; when none does, the earliest of
    all, a model change included (Insight #3: no swap that a deadline does not need).
    The replicas serving (or changing to) its model now are priced first; the others
    only when none of those meets the deadline (speed: most groups stop there).
    Returns (replica, α-quantile completion, mean completion), absolute times."""
    first = [v for v in live if g.model in (v.model, qr._changing.get(v.replica_id), "default")]
    if first:
        q, mean, rid, same = earliest(qr, g, first, now)
        if same[0] < math.inf:
            return same[2], same[0], same[1]
    q, mean, rid, same = earliest(qr, g, live, now)
    pick = same if same[0] < math.inf else (q, mean, rid)
    return pick[2], pick[0], pick[1]


def earliest(
    qr: QLMRouter, g: RequestGroup, cand: Sequence[ReplicaView], now: float
) -> tuple[float, float, int, tuple[float, float, int]]:
    """The earliest α-quantile completion of ``g`` at the tail of ``cand``'s queues
    (quantile, mean, replica) and the earliest among those that keep its model and
    meet its deadline."""
    best = (math.inf, math.inf, cand[0].replica_id)
    best_same = best
    # ties (free slots on several replicas: no wait anywhere) go to the least loaded
    for v in sorted(cand, key=lambda v: (v.outstanding, v.replica_id)):
        # a replica changing model serves the new one (its old one is draining)
        now_model = qr._changing.get(v.replica_id, v.model)
        # priced where place() puts it: behind its model's last group, or at the head
        at = insert_at(qr, qr.vq.get(v.replica_id, []), g.model, now_model)
        m, var, model = tail(qr, v, now, at)
        same = g.model in (model, now_model, "default")
        if model != g.model:
            m += qr._swap(v.replica_id, g.model)
        cm, cv = qr.rct.completion(g, qr._hw(v.replica_id))
        q = now + qr.rct.quantile(m + cm, var + cv)
        if q < best[0]:
            best = (q, now + m + cm, v.replica_id)
        if same and q <= g.deadline and q < best_same[0]:
            best_same = (q, now + m + cm, v.replica_id)
    return best[0], best[1], best[2], best_same
