"""One replica of the cluster: its lifecycle, its engine incarnations and its accounting.

A :class:`Replica` is a slot with a fixed id, model and spec. It runs one
:class:`~sloserve.engine.instance.Instance` at a time; a recovery after a failure starts a
fresh instance (an engine restart: empty KV, fresh policy state), its *incarnation*, with a
new instance id so that every request's token indices stay tied to the iteration log that
emitted them. Replica ids and the first incarnations' instance ids coincide (0..N-1).

Accounting (choices): GPU-seconds run from join to leave (or the end of the run), failed
time included — a failed machine is still held. Utilisation is busy time over those
GPU-seconds. KV usage is the mean over busy time (each scheduling decision's sample
weighted by its iteration time).

:class:`SimReplicaView` is the live, read-only :class:`~sloserve.cluster.view.ReplicaView`
of a replica; it computes on access, so replicas no router asks about cost nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sloserve.cluster.view import ReplicaStatus, RouteRequest
from sloserve.core.request import Request, RequestStatus
from sloserve.costmodel.base import BatchStats
from sloserve.engine.fastpath import kv_blocks_at
from sloserve.engine.instance import Instance
from sloserve.engine.prefix_peek import peek_many


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """What a replica is; a model change replaces it (new ``model`` and ``profile``)."""

    replica_id: int
    group: int
    profile: str
    policy: str
    model: str
    start_s: float
    role: str = "both"
    """``both``, ``prefill`` or ``decode`` (disaggregated serving)."""


InstanceFactory = Callable[[ReplicaSpec, int], Instance]
"""Builds an incarnation of a replica with the given instance id (on the cluster's env)."""


@dataclass
class Replica:
    """A replica slot and everything it did."""

    spec: ReplicaSpec
    status: ReplicaStatus = ReplicaStatus.JOINING
    instance: Instance | None = None
    incarnations: list[Instance] = field(default_factory=list)
    join_time: float | None = None
    leave_time: float | None = None
    served: int = 0
    """Requests that finished here."""
    failures: int = 0
    pending_model: str | None = None
    """The model it changes to once it has finished what it holds."""
    load_token: int = 0
    """Bumped by every load and failure: a load-done event with an old token is stale."""
    loads: list[tuple[float, float, str, str]] = field(default_factory=list)
    """(start, end, model, tier) of each model load."""
    warm_models: set[str] = field(default_factory=set)
    """Models whose weights it holds in host memory (loads of them are warm, from cpu)."""

    @property
    def replica_id(self) -> int:
        return self.spec.replica_id

    @property
    def holds(self) -> int:
        inst = self.instance
        return 0 if inst is None else inst.num_live

    def gpu_seconds(self, end: float) -> float:
        if self.join_time is None or self.join_time >= end:
            return 0.0
        leave = end if self.leave_time is None else min(self.leave_time, end)
        return max(leave - self.join_time, 0.0)

    def busy_seconds(self) -> float:
        return sum(i.busy_time for i in self.incarnations)

    def preemptions(self) -> int:
        return sum(i.num_preemptions for i in self.incarnations)

    def withdraw_unstarted(self, req_id: int) -> Request | None:
        """Take ``req_id`` out of the waiting queue if it has not started here (WAITING
        with nothing computed: never admitted, so it holds no KV and is in no batch in
        flight); None, and nothing changes, otherwise. The policy forgets it, as when a
        request leaves a replica after its prefill (a hand-off)."""
        inst = self.instance
        if inst is None:
            return None
        for k, r in enumerate(inst.waiting):
            if r.req_id == req_id:
                if r.status is not RequestStatus.WAITING or r.num_computed_tokens:
                    return None
                del inst.waiting[k]
                inst.kv.forget(req_id)
                inst.scheduler.on_finish(r, inst.env.now)
                r.instance_id = -1
                return r
        return None

    def kv_usage_mean(self) -> float | None:
        """KV usage weighted by iteration time over every decision of every incarnation.

        The sums run left to right over all of them, as a Python loop adding ``used / nb
        * d`` and ``d`` one by one would (``np.cumsum`` adds sequentially, and the
        elementwise steps are the same IEEE operations): the same floats, without a
        Python step per decision."""
        parts, durs = [np.zeros(1)], [np.zeros(1)]  # the loop's 0.0 start
        for inst in self.incarnations:
            tr = inst.trace
            if len(tr.kv_used_blocks) != len(tr.duration):
                raise ValueError("the instance trace's columns differ in length")
            d = np.asarray(tr.duration, dtype=np.float64)
            parts.append(np.asarray(tr.kv_used_blocks, dtype=np.float64) / inst.kv.num_blocks * d)
            durs.append(d)
        num = float(np.cumsum(np.concatenate(parts))[-1])
        den = float(np.cumsum(np.concatenate(durs))[-1])
        return num / den if den > 0 else None


class SimReplicaView:
    """Live read-only view of a :class:`Replica` for routers (see module docstring).

    Predicted TTFT (a choice; the papers do not fix one): the rest of the iteration in
    flight, plus ``ceil(q / P)`` iterations, where ``q`` is the prompt tokens queued there
    plus the request's own and P the replica's prefill budget; each iteration priced by the
    replica's cost model as a P-token prefill chunk batched with the running decodes.
    """

    __slots__ = ("_r",)

    def __init__(self, replica: Replica) -> None:
        self._r = replica

    @property
    def replica_id(self) -> int:
        return self._r.spec.replica_id

    @property
    def name(self) -> str:
        return f"replica-{self._r.spec.replica_id}"

    @property
    def group(self) -> int:
        return self._r.spec.group

    @property
    def capacity(self) -> int:
        inst = self._r.instance
        return 0 if inst is None else inst.limits.max_running

    @property
    def model(self) -> str:
        return self._r.spec.model

    @property
    def status(self) -> ReplicaStatus:
        return self._r.status

    @property
    def running(self) -> int:
        inst = self._r.instance
        return 0 if inst is None else len(inst.running)

    @property
    def waiting(self) -> int:
        inst = self._r.instance
        return 0 if inst is None else len(inst.waiting)

    @property
    def swapped(self) -> int:
        inst = self._r.instance
        return 0 if inst is None else len(inst.swapped)

    @property
    def outstanding(self) -> int:
        inst = self._r.instance  # Replica.holds inlined: routers read it for every candidate
        if inst is None:
            return 0
        return len(inst.waiting) + len(inst.running) + len(inst.swapped) + len(inst.incoming)

    @property
    def queued_prompt_tokens(self) -> int:
        inst = self._r.instance
        if inst is None:
            return 0
        total = sum(r.remaining_compute for r in inst.waiting)
        total += sum(
            r.remaining_compute for r in inst.swapped
        )  # swapped ones resume where they were: at most a decode each
        total += sum(r.remaining_compute - 1 for r in inst.running if r.remaining_compute > 1)
        return total

    @property
    def kv_usage(self) -> float:
        inst = self._r.instance
        if inst is None:
            return math.nan
        # exact mid-run: a run may fast-forward past this instant (fastpath.kv_blocks_at)
        return kv_blocks_at(inst, inst.env.now) / inst.kv.num_blocks

    def cached_prefix_tokens(self, req: RouteRequest) -> int | None:
        inst = self._r.instance
        if inst is None or not req.hash_ids:
            return 0
        return inst.kv.peek_prefix(req.hash_ids, req.prompt_tokens)

    @staticmethod
    def cached_prefix_tokens_many(
        req: RouteRequest, views: Sequence[SimReplicaView]
    ) -> Sequence[int | None]:
        """:meth:`cached_prefix_tokens` of each of ``views`` (all of this class), in one
        pass over their caches (``view.cached_prefix_tokens_all``, ``engine/prefix_peek.py``):
        a prefix router asks every candidate at every arrival."""
        if not req.hash_ids:
            return [0] * len(views)
        kvs = []
        for v in views:
            inst = v._r.instance
            kvs.append(None if inst is None else inst.kv)
        return peek_many(kvs, tuple(req.hash_ids), req.prompt_tokens)

    def predicted_ttft_s(self, req: RouteRequest) -> float | None:
        inst = self._r.instance
        if inst is None or self._r.status is not ReplicaStatus.UP:
            return None
        now = inst.env.now
        q = self.queued_prompt_tokens + req.prompt_tokens
        p = inst.limits.max_prefill_tokens
        chunk = min(p, q)
        decodes = [r for r in inst.running if r.status is RequestStatus.RUNNING and r.in_decode]
        stats = BatchStats(
            num_prefill_tokens=chunk,
            num_prefill_seqs=1,
            prefill_attn_work=chunk * chunk,
            num_decode=len(decodes),
            decode_context_sum=sum(r.num_computed_tokens for r in decodes),
        )
        per_iter = inst.cost_model.batch_time(stats)
        return max(inst.busy_until - now, 0.0) + math.ceil(q / p) * per_iter
