"""Schedules and the engine (InferMax §3.3 of ``papers/infermax.txt``): a fixed
:class:`~sloserve.optimal.infermax.schedule.Schedule` **replayed** (:func:`replay`) through
the real engine by :class:`ReplayScheduler`, which hands the engine one batch per
iteration (the engine's validator checks every batch and its clock gives the latencies,
which must equal the schedule's evaluation and the CSP objective); and any policy's
schedule **recorded** (:func:`record_policy`) by :class:`RecordingScheduler`, to seed the
CSP with a heuristic's schedule or to compare against it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sloserve.core.errors import ConfigError, SchedulerViolation
from sloserve.core.predictor import make_predictor
from sloserve.core.request import Request
from sloserve.costmodel.base import CostModel
from sloserve.engine.env import PRIO_ARRIVAL, Environment
from sloserve.engine.instance import Instance
from sloserve.engine.interface import (
    EMPTY_OUTPUT,
    InstanceView,
    Limits,
    PreemptionMode,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)
from sloserve.optimal.infermax.schedule import Job, Schedule, ScheduledBatch


class ReplayScheduler(Scheduler):
    """Feeds a fixed :class:`Schedule` to the engine, one batch per iteration.

    When a batch names a request that has not arrived yet the policy returns nothing and
    the engine sleeps until the next arrival (the CSP's batch start is the same
    ``max(previous end, arrivals)``). The engine validates every batch as for any policy;
    a batch naming a request that is not in the instance (``req_ids``, when given) or has
    already finished is refused here, since the engine never sees it (it would wait for an
    arrival that never comes, or end with the batch unrun).
    """

    name = "replay"
    chunked_prefill = True

    def __init__(self, schedule: Schedule, req_ids: Sequence[int] | None = None) -> None:
        self.batches = schedule.batches
        self.next = 0
        self.req_ids = None if req_ids is None else frozenset(req_ids)
        self.finished: set[int] = set()

    def on_finish(self, req: Request, now: float) -> None:
        self.finished.add(req.req_id)

    def schedule(self, view: InstanceView) -> SchedulerOutput:
        if self.next >= len(self.batches):
            return EMPTY_OUTPUT
        batch = self.batches[self.next]
        named = [rid for rid, _n in batch.entries] + list(batch.evict)
        gone = [
            rid
            for rid in named
            if rid in self.finished or (self.req_ids is not None and rid not in self.req_ids)
        ]
        if gone:
            raise SchedulerViolation(
                self.name,
                "batch",
                f"batch {self.next}: requests {gone} are finished or not in the instance",
            )
        live = {r.req_id: r for r in (*view.waiting, *view.running)}
        if any(rid not in live for rid, _n in batch.entries):
            return EMPTY_OUTPUT  # wait for an arrival
        missing = [rid for rid in batch.evict if rid not in live]
        if missing:
            raise SchedulerViolation(self.name, "preempt", f"requests {missing} are not live")
        self.next += 1
        return SchedulerOutput(
            batch=tuple(ScheduledRequest(live[rid], n) for rid, n in batch.entries),
            preempt=tuple((live[rid], PreemptionMode.RECOMPUTE) for rid in batch.evict),
        )


class RecordingScheduler(Scheduler):
    """Wraps a policy and records what it does as a :class:`Schedule`.

    The wrapped policy's ``repeatable`` promise is dropped so that the engine asks for
    every iteration (the engine guarantees the same result with and without its fast path).
    Swap preemptions cannot be recorded (the CSP models recompute only): they raise.
    """

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.name = inner.name
        self.default_prefill_tokens = inner.default_prefill_tokens
        self.chunked_prefill = inner.chunked_prefill
        self.batches: list[ScheduledBatch] = []

    def schedule(self, view: InstanceView) -> SchedulerOutput:
        out = self.inner.schedule(view)
        if out.swap_in or any(m is not PreemptionMode.RECOMPUTE for _r, m in out.preempt):
            raise ConfigError(f"policy {self.name!r} swaps KV; a schedule records recompute only")
        if out.batch:
            self.batches.append(
                ScheduledBatch(
                    tuple((s.request.req_id, s.num_tokens) for s in out.batch),
                    tuple(r.req_id for r, _m in out.preempt),
                )
            )
        elif out.preempt:
            raise ConfigError(f"policy {self.name!r} evicted without running a batch")
        if out.repeatable:
            return SchedulerOutput(batch=out.batch, preempt=out.preempt, swap_in=out.swap_in)
        return out

    def max_sequence_tokens(self, limits: Limits) -> int:
        return self.inner.max_sequence_tokens(limits)

    def on_finish(self, req: Request, now: float) -> None:
        self.inner.on_finish(req, now)

    def describe(self) -> dict[str, object]:
        return self.inner.describe()


@dataclass(frozen=True)
class EngineRun:
    """What the engine did with a policy or a replayed schedule."""

    requests: list[Request]
    iter_end: list[float]
    num_preemptions: int

    @property
    def all_finished(self) -> bool:
        return all(r.is_finished for r in self.requests)

    @property
    def total_latency(self) -> float:
        return float(sum((r.finish_time or 0.0) - r.arrival for r in self.requests))


def run_engine(
    policy: Scheduler, jobs: Sequence[Job], cost_model: CostModel, limits: Limits
) -> EngineRun:
    """Run ``policy`` on ``jobs`` in the engine (token-exact KV, oracle predictor)."""
    if limits.block_size != 1:
        raise ConfigError("schedules count KV token-exactly: block size must be 1")
    env = Environment()
    inst = Instance(
        env,
        policy,
        cost_model,
        limits,
        make_predictor("oracle"),
        multi_step=False,
        check_invariants=True,
    )
    reqs = [j.request() for j in jobs]
    for r in reqs:
        env.schedule(r.arrival, functools.partial(inst.add_request, r), PRIO_ARRIVAL)
    env.run()
    return EngineRun(reqs, list(inst.iter_end), inst.num_preemptions)


def replay(
    schedule: Schedule, jobs: Sequence[Job], cost_model: CostModel, limits: Limits
) -> EngineRun:
    """Replay ``schedule`` through the engine; a batch the engine refuses, or one left
    unrun when every request has finished, raises
    :class:`~sloserve.core.errors.SchedulerViolation`, an unfinished schedule a
    :class:`~sloserve.core.errors.StallError`.

    KV capacity beyond what every request holds at once (Σ (I + O)) never binds a fixed
    schedule, so the engine runs with M capped there (a huge M would otherwise allocate
    a free list of that many blocks).
    """
    cap = sum(j.input_tokens + j.output_tokens for j in jobs)
    if limits.kv_capacity_tokens > cap:
        limits = dataclasses.replace(limits, kv_capacity_tokens=max(cap, 1))
    sched = ReplayScheduler(schedule, [j.req_id for j in jobs])
    run = run_engine(sched, jobs, cost_model, limits)
    if sched.next < len(schedule.batches):
        raise SchedulerViolation(
            sched.name,
            "batch",
            f"batches {sched.next}..{len(schedule.batches) - 1} never ran "
            "(every request had finished)",
        )
    return run


def record_policy(
    policy: str | Scheduler,
    jobs: Sequence[Job],
    cost_model: CostModel,
    limits: Limits,
    params: Mapping[str, Any] | None = None,
) -> tuple[Schedule, EngineRun]:
    """Run a policy (a registry name or an instance) and record its schedule."""
    if isinstance(policy, str):
        from sloserve.policies.registry import make_policy

        policy = make_policy(policy, params)
    rec = RecordingScheduler(policy)
    run = run_engine(rec, jobs, cost_model, limits)
    return Schedule(tuple(rec.batches), {"source": f"policy:{policy.name}"}), run
