"""QLM's model changes, split from ``router.py`` (one concept): when a replica changes
its model, and which models it keeps warm in CPU memory.

- **QLM** (:func:`warm_start`): a replica whose virtual queue's head group
  is of another model changes to it (:class:`ChangeModel`: it finishes what it holds,
  then loads; with ``swap: flush`` it first gives them back, ``flush.py``), unless
  Insight #3's checks keep its model for now (:func:`keep_model`: its own groups first
  when that scores no worse; :func:`can_wait`: a busy replica
  defers while the head's deadline allows; :func:`reads_ahead`: a replica keeps its model
  while the head's model is read into CPU memory); the warm-start LSO keeps the next models of its
  queue in CPU memory, in bytes, each warm only once read from disk (``warm.py``).
- **The pull baselines** ``edf``/``fcfs`` (:func:`swap_for_head`): an idle
  replica changes to the model of the head of the global queue.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

from sloserve.cluster.controller import Action, ChangeModel
from sloserve.cluster.qlm.flush import flush_waits, take_back
from sloserve.cluster.qlm.groups import RequestGroup
from sloserve.cluster.qlm.warm import catalog_weight_bytes
from sloserve.cluster.view import ClusterView, ReplicaStatus, ReplicaView

if TYPE_CHECKING:
    from sloserve.cluster.qlm.router import QLMRouter


def weight_bytes(qr: QLMRouter, model: str) -> float:
    """A model's checkpoint bytes: the simulation's registry when it gives them, else
    the spec catalog; unknown: infinite (never kept warm)."""
    b = None
    if qr.hooks is not None and qr.hooks.weight_bytes is not None:
        b = qr.hooks.weight_bytes(model)
    if b is None:
        b = catalog_weight_bytes(model)
    return math.inf if b is None else b


def swap_for_head(qr: QLMRouter, view: ClusterView) -> list[Action]:
    """Baselines' model changes (no grouping): an idle replica changes to the model of
    the head of the global queue (their order); the first held request whose model no
    replica serves or loads makes the least-loaded UP replica change."""
    for rid, model in list(qr._changing.items()):
        v = view.replica(rid)
        if v.model == model and v.status is ReplicaStatus.UP:
            del qr._changing[rid]
    key = qr._deadline if qr.mode == "edf" else (lambda r: r.arrival)
    held = [r for r in qr._held.values() if r.model != "default"]
    if not held:
        return []
    up = [
        v
        for v in view.replicas()
        if v.status is ReplicaStatus.UP and v.replica_id not in qr._changing
    ]
    out: list[Action] = []
    # An idle replica serves the head of the global queue, changing model when the
    # head is of another model: the per-instance pull of the paper's baselines, which
    # swaps whenever the order says so (Insight #3's thrash).
    head = min(held, key=lambda r: (key(r), r.arrival))
    for v in up:
        if v.outstanding == 0 and v.model != head.model:
            out.append(change(qr, v.replica_id, head.model))
            break
    covered = {v.model for v in qr._live(view)} | set(qr._changing.values())
    waiting = [r for r in held if r.model not in covered]
    up = [v for v in up if v.replica_id not in qr._changing]
    if waiting and up:  # a model no replica serves: the least-loaded replica changes
        first = min(waiting, key=lambda r: (key(r), r.arrival))
        v = min(up, key=lambda v: (v.outstanding, v.replica_id))
        out.append(change(qr, v.replica_id, first.model))
    return out


def change(qr: QLMRouter, rid: int, model: str) -> ChangeModel:
    qr._changing[rid] = model
    qr.stats.model_changes += 1
    return ChangeModel(rid, model)


def warm_start(qr: QLMRouter, view: ClusterView) -> list[Action]:
    """Model changes for heads of another model, and (the warm-start LSO) the models
    kept in CPU memory: the queue's next models that fit, once read from disk
    (``warm.py``). A change that would flush the replica whose request is finishing
    waits (``flush.py``, :func:`flush_waits`)."""
    out: list[Action] = []
    for rid in list(qr.vq):  # a flush re-places groups: the queues may change meanwhile
        gids, v = qr.vq.get(rid, []), view.replica(rid)
        if qr.hooks is not None:
            warm: set[str] = set()
            if "warm-start" in qr.lsos:
                mem = qr.cpu_mem.get(rid)
                if mem is None:
                    mem = qr.cpu_mem[rid] = qr._new_cpu_memory()
                # the model it is changing to comes first: its load is committed even
                # when its groups have left this queue (pulled elsewhere, replanned)
                going = qr._changing.get(rid)
                queued = (g.model for gid in gids if (g := qr.table.groups.get(gid)))
                models = itertools.chain([going] if going else [], queued)
                warm = mem.update(models, v.model, lambda m: weight_bytes(qr, m), view.now)
            qr.hooks.set_warm(rid, warm)
        pending = qr._changing.get(rid)
        if pending is not None and v.model == pending and v.status is ReplicaStatus.UP:
            del qr._changing[rid]
            pending = None
        head = next((qr.table.groups[g] for g in gids if g in qr.table.groups), None)
        if head is None or head.model in ("default", v.model) or pending == head.model:
            continue
        if v.status is not ReplicaStatus.UP or keep_model(qr, v, gids, head, view.now):
            continue
        if v.outstanding > 0 and can_wait(qr, v, head, view.now):
            continue
        if reads_ahead(qr, v, head, view.now):
            continue
        if flush_waits(qr, v):
            continue
        qr._loaded_at[rid] = view.now + qr._swap(rid, head.model)
        qr._changing[rid] = head.model
        qr.stats.model_changes += 1
        out += take_back(qr, rid, view)  # swap=flush: Requeue first, the load starts at once
        qr._unserved_since_change.add(rid)
        out.append(ChangeModel(rid, head.model))
    return out


def can_wait(qr: QLMRouter, v: ReplicaView, head: RequestGroup, now: float) -> bool:
    """Insight #3, no swap that a deadline does not need: a busy replica defers a change
    while the head group would still meet its deadline (level α) with the change begun a
    tick later; the requests of its current model that arrive meanwhile are served
    without a drain and a load. A head group late even now does not wait (deferring
    cannot save it, and it must not starve)."""
    hw = qr._hw(v.replica_id)
    m, var = qr._ready(v, now)
    cm, cv = qr.rct.completion(head, hw)
    done = now + qr.rct.quantile(m + qr._swap(v.replica_id, head.model) + cm, var + cv)
    return done + (qr.tick_s or 1.0) <= head.deadline


def reads_ahead(qr: QLMRouter, v: ReplicaView, head: RequestGroup, now: float) -> bool:
    """§5's two-stage warm start ("Storage-CPU swapping: the model is first swapped from the
    LLM model registry to CPU memory, and (2) CPU-GPU swapping"): while the head group's
    model is still being read from disk into this replica's CPU memory, the replica keeps
    its current model and begins the change (its drain, priced as in
    :meth:`QLMRouter._swap`) only when the drain would end by the read's end. Beginning
    earlier cannot end the load sooner (the load waits for the read, ``ReadsIntoCPU``); it
    only keeps the replica from serving. An idle replica waits too: requests of its model
    may come meanwhile (on the quick W_A_large at seed 0 a lull of 1.5 s emptied it, and
    it then waited out 64 s of a Llama-2-70B read loading). Measured reason: on the quick
    W_A_large QLM's replica waited out a 68.9 s read drained and idle
    (``benchmarks/qlm_limits.py``)."""
    if "warm-start" not in qr.lsos:
        return False
    mem = qr.cpu_mem.get(v.replica_id)
    end = None if mem is None else mem.read_end(head.model, now)
    if end is None:  # not being read (already warm, or not kept): nothing to wait for
        return False
    hw = qr._hw(v.replica_id)
    drain = 0.0 if qr.swap == "flush" else qr.rct.lengths.prior[0] * hw.decode_s_per_token
    return now + drain * hw.inefficiency + (qr.tick_s or 1.0) < end


def change_cost(qr: QLMRouter, rid: int, model: str, now: float, offset: float) -> float:
    """What a change of replica ``rid`` to ``model`` begun ``offset`` s from ``now`` adds:
    :meth:`QLMRouter._swap` (drain + load, the load cold unless the model is warm), except
    while the model is being read into the replica's CPU memory (the warm-start LSO): then
    the load ends at the later of the drain's end and the read's end, plus the copy from
    CPU memory (the cold load less the read, ``weight bytes ÷ disk rate``). So work done
    before the change costs the change nothing while the read goes on (§5's two stages)."""
    cost = qr._swap(rid, model)
    mem = qr.cpu_mem.get(rid) if "warm-start" in qr.lsos else None
    if mem is None or qr.hooks is None:
        return cost
    end = mem.read_end(model, now)
    if end is None:
        return cost
    load = qr.hooks.swap_s(rid, model)
    warm = max(0.0, load - weight_bytes(qr, model) / mem.disk_bytes_per_s)
    drain = cost - load
    begin = now + offset
    return min(cost, max(begin + drain, end) + warm - begin)


def keep_model(
    qr: QLMRouter, v: ReplicaView, gids: list[int], head: RequestGroup, now: float
) -> bool:
    """Insight #3 before a model change: the groups of the replica's current model in
    its queue move to the front when that order scores no worse (Eq. 13: fewer predicted
    deadline misses at level α, then the smaller total completion) than changing model
    for the head group now; then the replica keeps its model for now. A head group that
    misses its deadline either way (a cold load longer than its deadline) no longer makes
    a busy replica drop the model its other groups need."""
    same = [g for g in gids if (h := qr.table.groups.get(g)) is not None and h.model == v.model]
    if not same:
        return False
    kept = same + [g for g in gids if g not in set(same)]
    if queue_score(qr, v, kept, now) > queue_score(qr, v, gids, now):
        return False
    qr.vq[v.replica_id] = kept
    return True


def queue_score(qr: QLMRouter, v: ReplicaView, gids: list[int], now: float) -> tuple[int, float]:
    """(predicted deadline misses, total α-quantile completion) of replica ``v``'s
    groups run in the order ``gids`` (Eq. 10–13 on one queue)."""
    rid = v.replica_id
    hw = qr._hw(rid)
    m, var = qr._ready(v, now)
    model, late, total = qr._changing.get(rid, v.model), 0, 0.0
    for gid in gids:
        g = qr.table.groups.get(gid)
        if g is None:
            continue
        if g.model != model:
            m, model = m + change_cost(qr, rid, g.model, now, m), g.model
        cm, cv = qr.rct.completion(g, hw)
        done = now + qr.rct.quantile(m + cm, var + cv)
        late += done > g.deadline
        total += done
        w, wv = qr.rct.work(g, hw)
        m, var = m + w, var + wv
    return late, total
