"""One serving replica: queues, a KV cache, a policy and a cost-model executor.

Each iteration follows DESIGN.md's engine step: the policy chooses
(``schedule(view)``), the instance validates and applies the choice (evictions, swaps,
KV allocation), the executor prices the batch with the cost model, and when the iteration
ends the instance emits tokens and finishes requests. Timing: a request is admitted and its
KV allocated when its iteration starts; its tokens are delivered when the iteration ends.

Fast path: when the policy marks a decode-only batch ``repeatable``, the instance advances
up to the next event (an arrival, a request finishing, a KV block it could not allocate) in
one step, pricing all those iterations with one vectorised cost-model call. The result is
the same as stepping one iteration at a time; ``multi_step=False`` turns the fast path off
(tests compare the two).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sloserve.core.errors import SchedulerViolation, StallError
from sloserve.core.predictor import OutputLengthPredictor
from sloserve.core.request import Request, RequestStatus
from sloserve.costmodel.base import BatchStats, CostModel
from sloserve.engine.env import PRIO_ITERATION, Environment
from sloserve.engine.interface import (
    InstanceView,
    Limits,
    PreemptionMode,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)
from sloserve.engine.kv import KVCacheManager, PagedKVManager

_QUEUED = (RequestStatus.WAITING, RequestStatus.PREEMPTED_RECOMPUTE)
_MAX_FAST_STEPS = 1 << 14


def _arrival_key(r: Request) -> tuple[float, int]:
    return (r.arrival, r.req_id)


@dataclass
class InstanceTrace:
    """Per-scheduling-decision samples for plots (one row per decision, not per token)."""

    time: list[float] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    swapped: list[int] = field(default_factory=list)
    kv_used_blocks: list[int] = field(default_factory=list)
    batch_size: list[int] = field(default_factory=list)
    batch_tokens: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)


@dataclass
class _Pending:
    batch: tuple[ScheduledRequest, ...]
    ends: list[float]
    fast: bool


class Instance:
    """A replica stepped by a discrete-event :class:`Environment`."""

    def __init__(
        self,
        env: Environment,
        scheduler: Scheduler,
        cost_model: CostModel,
        limits: Limits,
        predictor: OutputLengthPredictor,
        *,
        instance_id: int = 0,
        kv: KVCacheManager | None = None,
        cpu_swap_blocks: int = 0,
        max_context: int | None = None,
        multi_step: bool = True,
        check_invariants: bool = False,
        on_done: Callable[[Request], None] | None = None,
    ) -> None:
        self.env = env
        self.scheduler = scheduler
        self.cost_model = cost_model
        self.limits = limits
        self.instance_id = instance_id
        self.kv: KVCacheManager = kv or PagedKVManager(
            limits.kv_capacity_tokens // limits.block_size, limits.block_size, cpu_swap_blocks
        )
        self.max_context = max_context
        self.multi_step = multi_step
        self.debug_checks = check_invariants
        self.on_done = on_done
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.done: list[Request] = []
        self.iter_end: list[float] = []
        """End time of every iteration; token times index into it."""
        self.trace = InstanceTrace()
        self.num_preemptions = 0
        self.num_swaps = 0
        self.busy_time = 0.0
        self._busy = False
        self._wake_pending = False
        self._pending: _Pending | None = None
        self.view = InstanceView(
            instance_id=instance_id,
            waiting=self.waiting,
            running=self.running,
            swapped=self.swapped,
            kv=self.kv,
            cost_model=cost_model,
            predictor=predictor,
            limits=limits,
        )
        self._max_seq = min(self.kv.capacity_tokens, scheduler.max_sequence_tokens(limits))

    # ------------------------------------------------------------------ arrivals
    @property
    def num_live(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def add_request(self, req: Request) -> None:
        """A request arrives now; it is queued, or rejected if it can never be served."""
        now = self.env.now
        req.instance_id = self.instance_id
        total = req.num_prompt_tokens + req.true_output_len
        reason = ""
        if self.max_context is not None and total > self.max_context:
            reason = f"prompt+output {total} tokens exceeds the model context {self.max_context}"
        elif total > self._max_seq:
            reason = (
                f"prompt+output {total} tokens exceeds what policy {self.scheduler.name!r} "
                f"can hold ({self._max_seq} tokens)"
            )
        if reason:
            req.reject(now, reason)
            self._done(req)
            return
        bisect.insort(self.waiting, req, key=_arrival_key)
        if not self._busy and not self._wake_pending:
            self._wake_pending = True
            # Woken as an iteration event so that every arrival at this instant is queued first.
            self.env.schedule(now, self._iterate, PRIO_ITERATION)

    def _done(self, req: Request) -> None:
        self.done.append(req)
        if self.on_done is not None:
            self.on_done(req)

    # ------------------------------------------------------------------ iterations
    def _iterate(self) -> None:
        self._wake_pending = False
        env = self.env
        now = env.now
        self.view.now = now
        out = self.scheduler.schedule(self.view)
        if out.empty:
            self._busy = False
            if self.num_live and env.peek() == math.inf:
                raise StallError(
                    f"policy {self.scheduler.name!r} scheduled nothing at t={now:.3f}s with "
                    f"{len(self.waiting)} waiting, {len(self.running)} running, "
                    f"{len(self.swapped)} swapped requests and no future event"
                )
            return
        pending = self._apply(out, now)
        self._pending = pending
        self._busy = True
        env.schedule(pending.ends[-1], self._complete, PRIO_ITERATION)

    def _violation(self, limit: str, detail: str) -> SchedulerViolation:
        return SchedulerViolation(self.scheduler.name, limit, detail)

    def _validate(self, out: SchedulerOutput) -> tuple[int, int, int]:
        """Check ``out`` against the limits; returns (tokens, prefill tokens, admitted)."""
        lim = self.limits
        me = self.instance_id
        preempted: set[int] = set()
        for r, _mode in out.preempt:
            if r.status is not RequestStatus.RUNNING or r.instance_id != me:
                raise self._violation("preempt", f"request {r.req_id} is {r.status.name}, not RUNNING here")
            if r.req_id in preempted:
                raise self._violation("preempt", f"request {r.req_id} preempted twice")
            preempted.add(r.req_id)
        swapping: set[int] = set()
        for r in out.swap_in:
            if r.status is not RequestStatus.PREEMPTED_SWAPPED or r.instance_id != me:
                raise self._violation("swap_in", f"request {r.req_id} is {r.status.name}, not swapped here")
            if r.req_id in swapping:
                raise self._violation("swap_in", f"request {r.req_id} swapped in twice")
            swapping.add(r.req_id)
        seen: set[int] = set()
        tokens = prefill = admitted = 0
        for sr in out.batch:
            r, n = sr.request, sr.num_tokens
            rid = r.req_id
            if rid in seen:
                raise self._violation("batch", f"request {rid} appears twice")
            seen.add(rid)
            st = r.status
            if r.instance_id != me:
                raise self._violation("batch", f"request {rid} belongs to another instance")
            if st is RequestStatus.RUNNING:
                if rid in preempted:
                    raise self._violation("batch", f"request {rid} is both preempted and scheduled")
            elif st in _QUEUED:
                admitted += 1
            elif st is RequestStatus.PREEMPTED_SWAPPED:
                if rid not in swapping:
                    raise self._violation("batch", f"request {rid} is swapped out and not swapped in")
            else:
                raise self._violation("batch", f"request {rid} is {st.name}")
            remaining = r.remaining_compute
            if n < 1 or n > remaining:
                raise self._violation(
                    "batch", f"request {rid} given {n} tokens, must be 1..{remaining}"
                )
            tokens += n
            if not r.in_decode:
                prefill += n
        if tokens > lim.max_batch_tokens:
            raise self._violation("C (max batch tokens)", f"{tokens} tokens > C={lim.max_batch_tokens}")
        if prefill > lim.max_prefill_tokens:
            raise self._violation(
                "P (max prefill tokens)", f"{prefill} prefill tokens > P={lim.max_prefill_tokens}"
            )
        running_after = len(self.running) - len(preempted) + len(swapping) + admitted
        if running_after > lim.max_running:
            raise self._violation("R_max (max running)", f"{running_after} running > R_max={lim.max_running}")
        return tokens, prefill, admitted

    def _apply(self, out: SchedulerOutput, now: float) -> _Pending:
        tokens, prefill, admitted = self._validate(out)
        kv = self.kv
        swap_tokens = 0
        for r, mode in out.preempt:
            self.running.remove(r)
            self.num_preemptions += 1
            if mode is PreemptionMode.SWAP:
                if not kv.can_swap_out(r.req_id):
                    raise self._violation(
                        "CPU swap capacity", f"request {r.req_id} does not fit the CPU swap tier"
                    )
                swap_tokens += kv.swap_out(r.req_id)
                r.preempt_swap(now)
                self.num_swaps += 1
                bisect.insort(self.swapped, r, key=_arrival_key)
            else:
                kv.free(r.req_id)
                r.preempt_recompute(now)
                bisect.insort(self.waiting, r, key=_arrival_key)
        for r in out.swap_in:
            moved = kv.swap_in(r.req_id)
            if moved is None:
                raise self._violation("M (KV capacity)", f"no room to swap request {r.req_id} back in")
            swap_tokens += moved
            r.swap_in(now)
            self.swapped.remove(r)
            bisect.insort(self.running, r, key=_arrival_key)

        batch = out.batch
        fast_k = 0
        if (
            out.repeatable
            and self.multi_step
            and prefill == 0
            and admitted == 0
            and swap_tokens == 0
            and not out.preempt
        ):
            fast_k = self._fast_steps(batch, now)

        n_prefill_seqs = work = n_decode = ctx = 0
        for sr in batch:
            r, n = sr.request, sr.num_tokens
            if r.status is not RequestStatus.RUNNING:
                r.start(now)
                self.waiting.remove(r)
                bisect.insort(self.running, r, key=_arrival_key)
            if r.in_decode:
                n_decode += 1
                ctx += r.num_computed_tokens
            else:
                n_prefill_seqs += 1
                work += n * (n + r.num_computed_tokens)
            if kv.allocate(r.req_id, fast_k or n) is None:
                raise self._violation(
                    "M (KV capacity)",
                    f"request {r.req_id} needs {kv.blocks_needed(r.req_id, n)} more blocks, "
                    f"{kv.num_free_blocks} free",
                )

        cm = self.cost_model
        if fast_k:
            durs = cm.decode_run_times(n_decode, ctx, fast_k)
            ends = (now + np.cumsum(durs)).tolist()
        else:
            stats = BatchStats(
                num_prefill_tokens=prefill,
                num_prefill_seqs=n_prefill_seqs,
                prefill_attn_work=work,
                num_decode=n_decode,
                decode_context_sum=ctx,
                swap_tokens=swap_tokens,
            )
            dur = cm.batch_time(stats) + cm.swap_time(swap_tokens)
            if not dur > 0:
                raise self._violation("batch", f"cost model {cm.name!r} priced the batch at {dur}s")
            ends = [now + dur]
        tr = self.trace
        tr.time.append(now)
        tr.running.append(len(self.running))
        tr.waiting.append(len(self.waiting))
        tr.swapped.append(len(self.swapped))
        tr.kv_used_blocks.append(kv.num_used_blocks)
        tr.batch_size.append(len(batch))
        tr.batch_tokens.append(tokens)
        tr.steps.append(len(ends))
        tr.duration.append(ends[-1] - now)
        self.busy_time += ends[-1] - now
        if self.debug_checks:
            kv.check_invariants()
        return _Pending(batch, ends, fast_k > 0)

    def _fast_steps(self, batch: tuple[ScheduledRequest, ...], now: float) -> int:
        """How many identical decode iterations can run before anything could change."""
        k = min(_MAX_FAST_STEPS, min(sr.request.remaining_output for sr in batch))
        if k <= 1:
            return 0
        kv = self.kv
        n = len(batch)
        ctx = sum(sr.request.num_computed_tokens for sr in batch)
        t_next = self.env.peek()
        if t_next != math.inf:
            ends = now + np.cumsum(self.cost_model.decode_run_times(n, ctx, k))
            # The iteration during which the next event happens is the last one we may run.
            k = min(k, int(np.searchsorted(ends, t_next, side="left")) + 1)
            if k <= 1:
                return 0
        bs = kv.block_size
        slack = np.fromiter(
            (kv.num_request_blocks(sr.request.req_id) * bs - kv.num_tokens(sr.request.req_id) for sr in batch),
            dtype=np.int64,
            count=n,
        )
        free = kv.num_free_blocks

        def need(steps: int) -> int:
            return int(np.maximum(0, -((slack - steps) // bs)).sum())

        if need(k) > free:
            lo, hi = 1, k  # need(lo) <= free is checked by the caller's normal path
            if need(1) > free:
                return 0
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if need(mid) <= free:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        return k if k > 1 else 0

    def _complete(self) -> None:
        pending = self._pending
        if pending is None:  # the run was torn down (abort_all) while this was in flight
            return
        self._pending = None
        ends = pending.ends
        end = ends[-1]
        first = len(self.iter_end)
        self.iter_end.extend(ends)
        k = len(ends)
        for sr in pending.batch:
            r = sr.request
            if pending.fast:
                r.num_computed_tokens += k
                r.record_tokens(first, k)
            else:
                r.num_computed_tokens += sr.num_tokens
                if r.num_computed_tokens == r.num_prompt_tokens + r.num_output_tokens:
                    if r.first_token_time is None:
                        r.first_token_time = end
                    r.record_tokens(first, 1)
            if r.num_output_tokens >= r.true_output_len:
                self.kv.free(r.req_id)
                self.running.remove(r)
                r.finish(end)
                self.scheduler.on_finish(r, end)
                self._done(r)
        self._iterate()

    # ------------------------------------------------------------------ teardown
    def abort_all(self) -> int:
        """Abort every live request (the run's horizon was reached); returns how many."""
        now = self.env.now
        live = [*self.waiting, *self.running, *self.swapped]
        for r in live:
            if r.status is RequestStatus.PREEMPTED_SWAPPED:
                self.kv.drop_swapped(r.req_id)
            else:
                self.kv.free(r.req_id)
            r.abort(now)
            self._done(r)
        self.waiting.clear()
        self.running.clear()
        self.swapped.clear()
        self._pending = None
        self._busy = False
        return len(live)
