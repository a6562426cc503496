"""One serving replica: queues, a KV cache, a policy and an executor.

Each iteration follows DESIGN.md's engine step: the policy chooses
(``schedule(view)``), the instance validates and applies the choice (evictions, swaps,
KV allocation), the executor (:mod:`~sloserve.engine.executor`: the cost model by default,
a real model in execute mode) says how long the batch takes, and when the iteration
ends the instance emits tokens and finishes requests. Timing: a request is admitted and its
KV allocated when its iteration starts; its tokens are delivered when the iteration ends.

Beside this file: :mod:`~sloserve.engine.checks` validates each policy output first,
:mod:`~sloserve.engine.fastpath` advances a ``repeatable`` batch to the next event in one
step (as stepping would; ``multi_step=False`` turns it off),
:mod:`~sloserve.engine.prefix_cache` reuses cached prefixes,
:mod:`~sloserve.engine.filling` keeps the running requests that may still be filling,
:mod:`~sloserve.engine.retire` delivers an iteration's tokens and finishes when it ends,
:mod:`~sloserve.engine.continuation` carries the running decodes checked at one decision to
the next (a batch starting with them is checked after them only), and
:mod:`~sloserve.engine.teardown` lets requests leave before they finish (abort, horizon,
failure, a prefill replica's hand-off).

Disaggregated prefill/decode (set by the cluster): with :attr:`Instance.hand_off` set a
request leaves after its first token (unless it was its last), KV freed, to the callback;
:meth:`Instance.add_prefilled` takes it on a decode replica, its prompt's KV allocated on
admission (no recompute), waiting in arrival order while the KV cache has no room.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sloserve.core.errors import SchedulerViolation, StallError
from sloserve.core.predictor import OutputLengthPredictor
from sloserve.core.request import Request, RequestStatus
from sloserve.costmodel.base import CostModel, batch_stats
from sloserve.engine import chunk_run, decode_run, prefix_cache, retire, teardown, thrash
from sloserve.engine import continuation as conts
from sloserve.engine import filling as fills
from sloserve.engine.checks import check_batch, check_evictions
from sloserve.engine.continuation import Continuation
from sloserve.engine.env import PRIO_ITERATION, Environment
from sloserve.engine.executor import CostModelExecutor, ExecBatch, Executor, price
from sloserve.engine.fastpath import apply_run, plan_run
from sloserve.engine.interface import (
    InstanceView,
    Limits,
    PreemptionMode,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)
from sloserve.engine.kv import KVCacheManager, PagedKVManager

_arrival_key = teardown.ARRIVAL_ORDER


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


@dataclass(slots=True)
class _Pending:
    batch: tuple[ScheduledRequest, ...]
    ends: list[float]
    fast: bool
    event: int = 0  # the id of its completion event
    busy_before: float = 0.0
    """Busy time before this run: a cut run's busy time is recomputed from it (the very
    float a run planned to stop there would have given)."""
    decodes: bool = False
    """A fast run whose every entry is a one-token decode (:func:`plan_run` sorted them):
    its tokens are delivered without sorting the entries again."""
    dec: Continuation | None = None
    """The batch's leading entries that are checked running decodes (all of a run of
    decodes), delivered as such; the instance's continuation once retired."""
    final: chunk_run.FinalChunk | None = None
    """A prompt's chunks run after these iterations, to its final one (:mod:`.chunk_run`)."""
    row_start: int = 0
    """Iterations of ``ends`` before those of the latest trace row (:mod:`.chunk_run`)."""


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
        executor: Executor | None = None,
    ) -> None:
        self.env = env
        self.executor: Executor = executor or CostModelExecutor(cost_model)
        self.scheduler = scheduler
        self.cost_model = cost_model
        self.limits = limits
        self.instance_id = instance_id
        if kv is None:
            kv = scheduler.make_kv(limits, cpu_swap_blocks)
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
        self._cont: Continuation | None = None
        """Running decodes checked at the last decision, for the next (:mod:`.continuation`)."""
        self._abort_after: list[Request] = []
        """Requests whose abort waits for the in-flight iteration that contains them."""
        # Preempting decisions since a request last left, len(done) then, since when
        self._thrash, self._thrash_done, self._thrash_since = 0, 0, 0.0  # (:mod:`.thrash`)
        self.incoming: list[Request] = []
        """Prefilled requests (:meth:`add_prefilled`) waiting for KV room, by arrival."""
        self.hand_off: Callable[[Request], None] | None = None
        """Set on a prefill replica: called with each request that leaves after its first
        token (module docstring)."""
        self.num_handed_off = 0
        self.filling: dict[int, Request] = {}
        """Running requests that may be part-way through a (re)fill, by id: a small
        superset the policy reads as :attr:`InstanceView.filling` (:mod:`.filling`)."""
        self.view = InstanceView(
            instance_id=instance_id,
            waiting=self.waiting,
            running=self.running,
            swapped=self.swapped,
            kv=self.kv,
            cost_model=cost_model,
            predictor=predictor,
            limits=limits,
            iter_end=self.iter_end,
            filling=self.filling.values(),
        )
        self._max_seq = min(self.kv.capacity_tokens, scheduler.max_sequence_tokens(limits))
        kv = self.kv
        self._prefix_kv = kv if isinstance(kv, prefix_cache.PrefixCachingKVManager) else None
        """The KV manager when it caches prefixes: the prefix-cache hooks are called only
        then (checked once here, not an ABC isinstance per decision)."""
        self.next_event: Callable[[], float] = env.peek
        """When the next event that can change this instance may happen: the fast path
        stops in the iteration during which it falls. Every pending event by default; a
        cluster narrows it to the events that can reach this replica."""

    # ------------------------------------------------------------------ arrivals
    @property
    def busy(self) -> bool:
        """An iteration is in flight."""
        return self._pending is not None

    @property
    def num_live(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped) + len(self.incoming)

    @property
    def busy_until(self) -> float:
        """When the iteration (or fast-forwarded run) now in flight ends; now when idle."""
        pending = self._pending
        return pending.ends[-1] if pending is not None else self.env.now

    def add_request(self, req: Request) -> None:
        """A request arrives now; it is queued, or rejected if it can never be served."""
        now = self.env.now
        req.instance_id = self.instance_id
        total = req.num_prompt_tokens + req.true_output_len
        # The last token's KV is never computed: a request holds at most I+O-1 tokens.
        reason = ""
        if self.max_context is not None and total > self.max_context:
            reason = f"prompt+output {total} tokens exceeds the model context {self.max_context}"
        elif total - 1 > self._max_seq:
            reason = (
                f"prompt+output {total} tokens exceeds what policy {self.scheduler.name!r} "
                f"can hold ({self._max_seq} tokens)"
            )
        if reason:
            req.reject(now, reason)
            self._done(req)
            return
        self.kv.note_class(req.req_id, req.req_class)
        if self._prefix_kv is not None:
            prefix_cache.queue_lookup(self._prefix_kv, req)
        bisect.insort(self.waiting, req, key=_arrival_key)
        if not self._busy and not self._wake_pending:
            self._wake_pending = True
            # Woken as an iteration event so that every arrival at this instant is queued first.
            self.env.schedule(now, self._iterate, PRIO_ITERATION)

    def add_prefilled(self, req: Request) -> None:
        """A request whose prompt a prefill replica computed arrives now with its KV
        (``num_computed_tokens`` tokens, one output token): the blocks are allocated here
        on admission and it runs as a decode; it waits (:attr:`incoming`) while the KV
        cache has no room or R_max requests run, and is rejected if it can never fit."""
        now = self.env.now
        req.instance_id = self.instance_id
        total = req.num_prompt_tokens + req.true_output_len
        if total - 1 > self._max_seq:
            req.reject(
                now,
                f"prompt+output {total} tokens exceeds what policy {self.scheduler.name!r} "
                f"can hold ({self._max_seq} tokens)",
            )
            self._done(req)
            return
        self.kv.note_class(req.req_id, req.req_class)
        bisect.insort(self.incoming, req, key=_arrival_key)
        self._admit_incoming(now)
        if not self._busy and not self._wake_pending:
            self._wake_pending = True
            self.env.schedule(now, self._iterate, PRIO_ITERATION)

    def _admit_incoming(self, now: float) -> None:
        """Allocate the KV of waiting prefilled requests, in order, while it fits and the
        running set is below R_max."""
        incoming = self.incoming
        cap = self.limits.max_running
        while incoming and len(self.running) < cap:
            r = incoming[0]
            if self.kv.allocate(r.req_id, r.num_computed_tokens) is None:
                return
            incoming.pop(0)
            r.start(now)
            bisect.insort(self.running, r, key=_arrival_key)
            fills.note_joined(self.filling, r)

    def _done(self, req: Request) -> None:
        self.kv.forget(req.req_id)
        self.done.append(req)
        if self.on_done is not None:
            self.on_done(req)

    # ------------------------------------------------------------------ iterations
    def _iterate(self) -> None:
        self._wake_pending = False
        env = self.env
        now = env.now
        self.view.now = now
        if self.incoming:
            self._admit_incoming(now)
        pkv = self._prefix_kv
        # Queued lookups retry only after an arrival or an end (refresh_queued's docstring);
        # tested here: most decisions have neither.
        if pkv is not None and (pkv.arrived or len(self.done) != pkv._ended_seen):
            prefix_cache.refresh_queued(self, pkv)
        cont = self._cont  # running decodes the policy may promise to schedule again
        out = None
        if cont is not None and self.scheduler.repeats_decode_run:
            out = decode_run.repeat(self, cont)  # (:mod:`.decode_run`)
        if out is None:
            out = self.scheduler.schedule(self.view)
        if pkv is not None and not out.batch:  # no batch: queued requests release prefixes
            out = prefix_cache.unblock(self, pkv, out)
        if out.empty:
            self._busy = False
            self._cont = None  # (idle: kept only from one decision to the next)
            if self.num_live and env.peek() == math.inf:
                raise StallError(
                    f"policy {self.scheduler.name!r} scheduled nothing at t={now:.3f}s with "
                    f"{len(self.waiting)} waiting, {len(self.running)} running, "
                    f"{len(self.swapped)} swapped requests and no future event "
                    f"(KV cache: {self.kv.num_used_blocks} of {self.kv.num_blocks} blocks used; "
                    "a policy that may not evict can deadlock when memory fills up)"
                )
            return
        try:
            pending = self._apply(out, now)
        except TypeError as e:  # e.g. a token count that is not an int (compiled build)
            raise SchedulerViolation(
                self.scheduler.name,
                "output types",
                f"{e} (a batch entry is ScheduledRequest(Request, int); preempt entries "
                "(Request, PreemptionMode))",
            ) from e
        self._pending = pending
        self._busy = True
        pending.event = env.schedule(
            pending.ends[-1], functools.partial(self._complete, pending), PRIO_ITERATION
        )

    def interrupt(self) -> None:
        """Cut a fast-forwarded run in flight after the iteration in progress now (one
        that ends now included: it ends before an iteration event now sees anything), as if
        the run had been planned to stop at this instant: what the cut iterations grew
        in the KV cache is given back and the run's end moves earlier. Called before a
        request reaches the instance mid-run; needs ``kv.can_shrink``."""
        pending = self._pending
        if pending is None or not chunk_run.drop_final(pending) or not pending.fast:
            return
        ends = pending.ends
        keep = bisect.bisect_left(ends, self.env.now) + 1
        cut = len(ends) - keep
        if cut <= 0:
            return
        kv = self.kv
        batch: Sequence[ScheduledRequest] = pending.batch
        dec = pending.dec
        if dec is not None:  # the leading checked decodes: their ids, one pass, batch order
            kv.shrink_many(dec.ids, cut)
            batch = () if pending.decodes else batch[len(dec.entries) :]
        shrink = kv.shrink
        for r, n in batch:  # not retired yet: the counters are the run's start
            decode = r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens == 1
            shrink(r.req_id, cut if decode else cut * n)
        start = self.trace.time[-1]
        self.busy_time = pending.busy_before + (ends[keep - 1] - start)
        self.trace.steps[-1] = keep - pending.row_start
        self.trace.duration[-1] = ends[keep - 1] - start
        del ends[keep:]  # (the run owns its list: cut in place, as chunk_run extends it)
        self.env.cancel(pending.event)
        pending.event = self.env.schedule(
            ends[-1], functools.partial(self._complete, pending), PRIO_ITERATION
        )

    def _violation(self, limit: str, detail: str) -> SchedulerViolation:
        return SchedulerViolation(self.scheduler.name, limit, detail)

    def _apply(self, out: SchedulerOutput, now: float) -> _Pending:
        # The fast path counts blocks; an exact-fit manager (BROS's shared blocks) also
        # moves KV itself (restores), which only a single step prices.
        fast = self.executor.fast_forward and not self.kv.exact_fit
        if self.debug_checks:
            conts.verify(self)  # before this decision relies on it
        cont = self._cont
        self._cont = None  # (set again when this batch retires, or kept below)
        if fast and out.repeatable and not out.preempt and not out.swap_in:
            run = plan_run(self, out, now, cont)
            if run is not None:
                return apply_run(self, out, now, run, cont)
        preempted, swapping = check_evictions(self, out)
        lead = None
        if cont is not None and not out.preempt and not out.swap_in:
            lead = cont if conts.lead(cont, out.batch) else None
        tokens, prefill, admitted, split = check_batch(self, out, preempted, swapping, lead)
        if lead is None and cont is not None and split and not split[0] and not out.preempt:
            # No one-token decode in the batch (a prefill step), nothing evicted or swapped
            # in (a swap-in leaves no split): the continuation's requests are untouched.
            self._cont = cont
        kv = self.kv
        swap_tokens = 0
        requeued: list[Request] = []
        if out.preempt:
            thrash.preempted(self)  # a livelock: an error, not a hang
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
                requeued.append(r)
                bisect.insort(self.waiting, r, key=_arrival_key)
        for r in out.swap_in:
            moved = kv.swap_in(r.req_id)
            if moved is None:
                raise self._violation(
                    "M (KV capacity)", f"no room to swap request {r.req_id} back in"
                )
            swap_tokens += moved
            r.swap_in(now)
            self.swapped.remove(r)
            bisect.insort(self.running, r, key=_arrival_key)
            fills.note_joined(self.filling, r)

        batch = out.batch
        kv_before = kv.num_used_blocks
        n_prefill_seqs = work = ctx = 0
        decode_ids: list[int] = []
        allocate = kv.allocate
        RUNNING = RequestStatus.RUNNING
        entries: Sequence[ScheduledRequest] = batch
        if split is not None:
            # check_batch sorted the entries (its pass, no swap-in): walk only the others.
            decode_ids, ctx, entries = split
        for r, n in entries:
            if r.status is not RUNNING:
                r.start(now)
                self.waiting.remove(r)
                running = self.running
                if running and _arrival_key(running[-1]) > _arrival_key(r):
                    bisect.insort(running, r, key=_arrival_key)
                else:  # (insort's place: usually the end, the latest arrival)
                    running.append(r)
                fills.note_joined(self.filling, r)
            computed = r.num_computed_tokens
            if split is None and (
                r.num_output_tokens and r.num_prompt_tokens + r.num_output_tokens - computed == 1
            ):
                decode_ids.append(r.req_id)
                ctx += computed
            else:
                n_prefill_seqs += 1
                work += n * (n + computed)
                if allocate(r.req_id, n) is None:
                    raise self._violation(
                        "M (KV capacity)",
                        f"request {r.req_id} needs {kv.blocks_needed(r.req_id, n)} more blocks, "
                        f"{kv.num_free_blocks} free",
                    )
        n_decode = len(decode_ids)
        if decode_ids and not kv.grow_many(decode_ids, 1):
            raise self._violation(
                "M (KV capacity)",
                f"{n_decode} decodes need {kv.decode_blocks_needed(decode_ids)} blocks, "
                f"{kv.num_free_blocks} free",
            )

        for r in requeued:  # after the batch: what was checked to fit stays free for it
            prefix_cache.reuse_prefix(self, r)
        swap_tokens += kv.take_transfer_tokens()  # BROS's restores; prefix-cache CPU hits
        stats = batch_stats(prefill, n_prefill_seqs, work, n_decode, ctx, swap_tokens)
        executor = self.executor
        if executor.__class__ is CostModelExecutor:  # what its run does, no ExecBatch built
            dur = price(executor.cost_model, stats, self.scheduler.overlap_swap)
        else:
            dur = executor.run(ExecBatch(batch, stats, self.scheduler.overlap_swap, kv))
        if not dur > 0:
            raise self._violation("batch", f"executor {self.executor.name!r} gave {dur}s")
        ends = [now + dur]
        dec = lead
        if split is not None and not split[2] and out.repeatable and not out.preempt:
            # (running decodes only, a repeatable batch: its delivery makes them the next)
            dec = decode_run.whole(batch, split, lead)
        pending = self._record(batch, ends, tokens, now, kv_before, fast=False, dec=dec)
        if admitted == 1 and split is not None and self.scheduler.repeats_joined_chunk:
            chunk_run.chain_join(self, out, pending, split)  # (its chunks may follow)
        return pending

    def _record(
        self,
        batch: tuple[ScheduledRequest, ...],
        ends: list[float],
        tokens: int,
        now: float,
        kv_used: int,
        *,
        fast: bool,
        decodes: bool = False,
        dec: Continuation | None = None,
    ) -> _Pending:
        """Sample the trace (KV use as the decision found it, before the batch grows it:
        the same in single steps and fast-forwarded runs) and build the pending batch."""
        kv = self.kv
        tr = self.trace
        tr.time.append(now)
        tr.running.append(len(self.running))
        tr.waiting.append(len(self.waiting))
        tr.swapped.append(len(self.swapped))
        tr.kv_used_blocks.append(kv_used)
        tr.batch_size.append(len(batch))
        tr.batch_tokens.append(tokens)
        tr.steps.append(len(ends))
        tr.duration.append(ends[-1] - now)
        busy_before = self.busy_time
        self.busy_time += ends[-1] - now
        if self.debug_checks:
            kv.check_invariants()
            fills.check(self.filling, self.running)
        # (by position: a keyword call costs a third more, once per decision)
        return _Pending(batch, ends, fast, 0, busy_before, decodes, dec)

    def _complete(self, pending: _Pending) -> None:
        if pending is not self._pending:  # torn down (abort_all) while it was in flight
            return
        if pending.final is not None and pending.final.phase != chunk_run.FINAL:
            chunk_run.advance(self, pending)  # the join or the middle iterations ended
            return
        self._pending = None
        retire.retire(self, pending, len(pending.ends))  # (the step loop: no method hop)
        if self._abort_after:
            aborts, self._abort_after = self._abort_after, []
            for r in aborts:
                self.abort(r)
        self._iterate()

    def _retire(self, pending: _Pending, k: int) -> None:
        """Deliver the first ``k`` iterations of a pending batch: tokens, finishes
        (:func:`~sloserve.engine.retire.retire`), for the teardown paths, which cannot
        import that module (it imports them). A method, not the function bound as a class
        attribute: a class compiled by mypyc (the compiled build) cannot bind one."""
        retire.retire(self, pending, k)

    # ------------------------------------------------------------------ teardown
    def abort(self, req: Request) -> bool:
        """Abort one live request (its client went away) and free its KV cache; False
        when it had already ended or is not here (:func:`~sloserve.engine.teardown.abort`:
        one in the iteration in flight is aborted when that iteration ends)."""
        return teardown.abort(self, req)

    def abort_all(self) -> int:
        """Abort every live request (the run's horizon was reached); returns how many."""
        return teardown.abort_all(self)

    def evacuate(self) -> list[Request]:
        """The replica failed: hand back every live request, WAITING again, from scratch,
        by arrival (:func:`~sloserve.engine.teardown.evacuate`)."""
        return teardown.evacuate(self)
