"""The engine's fast path: a repeatable batch advanced ``k`` iterations at once.

When the policy marks a decode-only (or non-final-chunk) batch ``repeatable``, the
instance runs it up to the next event that can change it (an arrival, a request finishing,
a KV block it could not allocate, :attr:`Instance.next_event`) in one step, pricing all
those iterations with one vectorised cost-model call. The result is the same as stepping
one iteration at a time (``multi_step=False``; tests compare the two): iteration end times
are accumulated one by one, the run stops in the iteration during which the next event
falls, and a prefix of a longer run prices exactly as the shorter run.

:func:`plan_run` decides ``k`` (or None: step normally) without changing anything;
:func:`apply_run` validates the batch against C and P, grows the KV cache for all ``k``
iterations and records the run (the instance delivers its tokens when it ends).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from sloserve.core.request import Request, RequestStatus
from sloserve.costmodel.base import BatchStats, batch_stats
from sloserve.costmodel.linear import LinearCostModel
from sloserve.engine import chunk_run, continuation
from sloserve.engine.continuation import Continuation
from sloserve.engine.interface import SchedulerOutput
from sloserve.engine.kv import PagedKVManager

if TYPE_CHECKING:
    from sloserve.engine.instance import Instance, _Pending

MAX_FAST_STEPS = 1 << 14
FIRST_LOOK = 64
"""Iterations priced first when looking for the next event (then all, if it is further)."""


def accumulate(now: float, durations: NDArray[np.float64]) -> NDArray[np.float64]:
    """End times of back-to-back iterations, added one by one exactly as single steps
    would (``now + d0``, then ``+ d1``...), so that the fast path never reorders an
    iteration end and an event that fall at the same instant."""
    ends = np.array(durations, dtype=np.float64)  # a copy
    if ends.size:
        ends[0] += now  # now + d0 (the same sum), then one by one: no concatenated copy
    return np.cumsum(ends, out=ends)


@dataclass(slots=True)
class Run:
    """A repeatable batch the fast path will advance ``k`` iterations at once."""

    k: int
    stats: BatchStats
    work_step: int
    decode_ids: list[int]
    prefills: list[tuple[Request, int]]
    durations: list[float] | None = None
    """The first >= k iteration times, when the next event was looked up (a prefix of a
    longer run prices exactly as the shorter run: each step is priced on its own)."""
    ends: list[float] | None = None
    lead: int = 0
    """Leading entries the instance's continuation had checked (:mod:`.continuation`)."""
    left: int = 0
    """The smallest number of iterations any entry can repeat (a decode: the tokens it
    has still to generate), before the run's cap: exact."""
    final: chunk_run.FinalChunk | None = None
    """The prompt's final chunk the run goes on with after its ``k`` middle iterations
    (:mod:`.chunk_run`)."""


_NO_LIMIT = 1 << 62


def plan_run(
    inst: Instance, out: SchedulerOutput, now: float, cont: Continuation | None = None
) -> Run | None:
    """How many identical iterations a repeatable batch may run; None: step normally.

    ``cont``: the instance's continuation; the batch's leading entries it checked are
    taken from it instead of walked (:mod:`.continuation`)."""
    me = inst.instance_id
    RUNNING = RequestStatus.RUNNING
    batch = out.batch
    prefills: list[tuple[Request, int]] = []
    pf_tokens = work = work_step = 0
    lead = continuation.lead(cont, batch)
    if lead:
        assert cont is not None
        entries = batch[lead:]
        # (The continuation's ids are copied only when the tail adds to them.)
        decode_ids = [*cont.ids] if entries else cont.ids
        ctx = cont.ctx
        k = cont.left
    else:
        entries = batch
        decode_ids = []
        ctx = 0
        k = _NO_LIMIT
    pf_left = 0
    for r, n in entries:
        n_out = r.num_output_tokens
        computed = r.num_computed_tokens
        remaining = r.num_prompt_tokens + n_out - computed
        if r.status is not RUNNING or r.instance_id != me:
            raise inst._violation("repeatable", f"request {r.req_id} is not running here")
        if n_out and remaining == 1 and n == 1:
            decode_ids.append(r.req_id)
            ctx += computed
            left = r.true_output_len - n_out
        elif 1 <= n < remaining:
            prefills.append((r, n))
            pf_tokens += n
            work += n * (n + computed)
            work_step += n * n
            left = pf_left = (remaining - 1) // n  # iterations before its final chunk
        else:
            raise inst._violation(
                "repeatable",
                f"request {r.req_id}: {n} tokens is neither a decode nor a non-final chunk",
            )
        if left < k:
            k = left
    left_min = k
    if len(prefills) == 1 and k == pf_left and chunk_run.eligible(inst):
        # Its final chunk may end the run (the fewest left is the chunk's).
        run = chunk_run.plan(
            inst,
            out,
            now,
            batch_stats(pf_tokens, 1, work, len(decode_ids), ctx),
            work_step,
            decode_ids,
            prefills[0],
            k,
            lead,
            cont.left if cont is not None and lead else _NO_LIMIT,
            left_min,
        )
        if run is not None:
            return run
    cap = MAX_FAST_STEPS if inst.multi_step else 1
    if k > cap:
        k = cap
    if k <= 1:
        return None
    stats = batch_stats(pf_tokens, len(prefills), work, len(decode_ids), ctx)
    t_next = inst.next_event()
    durs: list[float] | None = None
    ends: list[float] | None = None
    if t_next != math.inf:
        cm = inst.cost_model
        # Price a short prefix first: the next event is usually a few iterations away.
        first = min(k, FIRST_LOOK)
        if type(cm) is LinearCostModel or isinstance(cm, LinearCostModel):  # (ABC: slow)
            durs, ends = cm.run_until(stats, now, t_next, first, work_step)
            found = ends[-1] >= t_next
        else:
            d = cm.run_times(stats, first, work_step)
            durs, ends = d.tolist(), accumulate(now, d).tolist()
            found = False
        if not found:
            if len(durs) < k and ends[-1] < t_next:
                d = cm.run_times(stats, k, work_step)
                durs, ends = d.tolist(), accumulate(now, d).tolist()
            # The iteration during which the next event happens is the last one we run.
            k = min(k, bisect_left(ends, t_next) + 1)
        else:
            k = len(ends)
        if k <= 1:
            return None
    elif k <= FIRST_LOOK and (
        type(inst.cost_model) is LinearCostModel or isinstance(inst.cost_model, LinearCostModel)
    ):  # (the exact type first: an ABC's isinstance is slow, once per run)
        # No event in sight (a cluster replica between arrivals): a short run is cheaper
        # priced float by float than with arrays (the same floats).
        durs, ends = inst.cost_model.run_until(stats, now, t_next, k, work_step)
    kv = inst.kv
    reserve = out.repeat_reserve_blocks
    free = kv.num_free_blocks - reserve
    # (A paged manager's own first test, without the call: enough free blocks even if
    # every request starts on a full block.)
    paged = type(kv) is PagedKVManager or isinstance(kv, PagedKVManager)
    if not paged or free < len(decode_ids) * (k // kv.block_size + 1):
        k = kv.max_uniform_growth(decode_ids, k, free)
    if prefills:
        while k > 1 and sum(kv.blocks_needed(r.req_id, k * n) for r, n in prefills) > reserve:
            k -= 1  # the policy's reserve does not cover these chunks (rare: step down)
    if k <= 1:
        return None
    return Run(k, stats, work_step, decode_ids, prefills, durs, ends, lead, left_min)


def apply_run(
    inst: Instance, out: SchedulerOutput, now: float, run: Run, cont: Continuation | None = None
) -> _Pending:
    """Run ``run.k`` >= 2 identical iterations of a repeatable batch at once (``cont``:
    the continuation :func:`plan_run` was given)."""
    stats = run.stats
    batch = out.batch
    if run.lead != len(batch):  # (the continuation's entries appear once each)
        # Every entry is in exactly one of decode_ids and prefills (plan_run sorted them).
        ids = set(run.decode_ids)
        if run.prefills:
            ids.update(r.req_id for r, _n in run.prefills)
        if len(batch) != len(ids):
            raise inst._violation("batch", "a request appears twice")
    lim = inst.limits
    if stats.total_tokens > lim.max_batch_tokens:
        raise inst._violation(
            "C (max batch tokens)", f"{stats.total_tokens} tokens > C={lim.max_batch_tokens}"
        )
    if stats.num_prefill_tokens > lim.max_prefill_tokens:
        raise inst._violation(
            "P (max prefill tokens)",
            f"{stats.num_prefill_tokens} prefill tokens > P={lim.max_prefill_tokens}",
        )
    kv = inst.kv
    k = run.k
    kv_before = kv.num_used_blocks
    ok = kv.grow_many(run.decode_ids, k)
    for r, n in run.prefills:
        ok = ok and kv.allocate(r.req_id, k * n) is not None
    if not ok:  # plan_run checked this; a failure here is an engine bug
        raise inst._violation("M (KV capacity)", f"{k} repeated iterations do not fit")
    if run.durations is not None and run.ends is not None:
        first, ends = run.durations[0], run.ends[:k]
    else:
        durs = inst.cost_model.run_times(stats, k, run.work_step)
        first, ends = durs[0], accumulate(now, durs).tolist()
    if not first > 0:
        raise inst._violation(
            "batch", f"cost model {inst.cost_model.name!r} priced the batch at {first}s"
        )
    # The decodes whose tokens the run delivers, checked: all the entries of a run of
    # decodes; with non-final chunks, only the leading ones the continuation had checked.
    if not run.prefills:
        # A copy of a policy's list: the policy may edit that very list and return it
        # again, which would compare equal to itself and skip the checks.
        kept = batch if batch.__class__ is tuple else tuple(batch)
        dec: Continuation | None = Continuation(
            kept, run.decode_ids, stats.decode_context_sum, run.left
        )
    else:
        dec = cont if run.lead else None
    decodes = not run.prefills
    pending = inst._record(
        batch, ends, stats.total_tokens, now, kv_before, fast=True, decodes=decodes, dec=dec
    )
    pending.final = run.final  # (its iteration begins when the middle ones end)
    return pending


def kv_blocks_at(inst: Instance, now: float) -> int:
    """KV blocks in use at ``now`` as if the fast-forwarded run in flight were cut there
    (:meth:`Instance.interrupt`, without cutting it). A run grows the KV of all its
    iterations when it starts, so a router reading KV usage mid-run would otherwise see
    the run's end; this is what the replica would hold had every event stopped its runs,
    so routers that read only request counts and KV usage need not stop them."""
    kv = inst.kv
    used = kv.num_used_blocks
    pending = inst._pending
    if pending is None or not pending.fast or not isinstance(kv, PagedKVManager):
        return used
    if pending.final is not None and pending.final.phase == chunk_run.FINAL:
        return used  # a final chunk in flight: a single step, which nothing cuts
    ends = pending.ends
    cut = len(ends) - (bisect_left(ends, now) + 1)
    if cut <= 0:
        return used
    for r, n in pending.batch:  # not retired yet: the counters are the run's start
        decode = r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens == 1
        used -= kv.shrink_blocks(r.req_id, cut if decode else cut * n)
    return used
