"""Runs that carry a chunked prompt through to its final chunk.

With chunked prefill (Sarathi's P = 512) a long prompt takes several iterations: the
chunk that joins, middle chunks, and a shorter final chunk that completes the prefill and
emits the first token. The fast path (:mod:`.fastpath`) runs the middle chunks of a
repeatable batch at once, but a run had to stop before the final chunk (another batch: a
shorter chunk, other statistics), and the joining chunk is no run at all (the policy
admits the prompt), so a prompt cost up to three decisions: its joining chunk, its middle
run (or its last middle chunk alone) and its final chunk. When the policy promises what
its later batches are (:attr:`~sloserve.engine.interface.Scheduler.repeats_final_chunk`,
:attr:`~sloserve.engine.interface.Scheduler.repeats_joined_chunk`), the engine goes on
without asking it:

* a run of ``m`` middle chunks goes on through the final chunk (:func:`plan`);
* a single step admitting a prompt's joining chunk goes on through its ``m`` middle
  chunks (if any) and its final chunk (:func:`chain_join`).

Identical to what the engine did before, including the event heap and the trace:

* **When**: the batch's only prompt entry is that chunk and every other entry is a
  running decode (all of them), every decode has tokens to go beyond the final chunk's
  iteration (none finishes before), nothing waits, is swapped out or waits for KV room
  (nothing could join at the final chunk), the next event that can reach the replica
  (:attr:`Instance.next_event`) is not before the final iteration's end (nothing reads
  the replica in between, except an arrival that cuts the run, below), and the decodes'
  growth for all the iterations fits in the free blocks once the prompt's rest is kept
  (the policy's reserve). Only on the plain paged manager and the prefix-caching one
  (below; BROS's blocks move themselves), the cost-model executor, and not on a prefill
  replica that hands requests off. A refill steps as before (its final chunk may be a
  one-token decode); a prompt that found cached tokens chains from where they end.
* **Prefix caching** (:class:`~sloserve.engine.prefix_cache.PrefixCachingKVManager`).
  What a skipped decision did on that manager, besides the KV growth: the retire before
  it registered the prompt units its iterations completed (:meth:`retired`), then the
  decision retried queued lookups (:func:`~sloserve.engine.prefix_cache.refresh_queued`:
  nothing, since nothing arrived, waits or ended — an arrival or an abort drops the
  chain, no decode finishes), released nothing (:func:`~sloserve.engine.prefix_cache.
  unblock`: the batch is not empty) and priced no CPU-tier copy (the prompt's was taken
  by its joining chunk's allocation). So :func:`advance` registers, at the event that
  ends the iterations before each phase, what those iterations computed
  (:func:`_register_ended`, the counters not yet delivered: the very ``_register`` calls
  of the retires), then allocates as the decision did; the evictions an allocation
  makes are the same whole units in the same LRU order (a split of the same growth
  evicts the same count: each call evicts the fewest units its shortfall needs). A
  router's peek at any instant therefore sees the cache the single steps left there.
* **Phases at the old decisions' instants.** What was one decision's work is done at
  its instant, by the event that ended the iterations before it (the same time, priority
  and sequence number: the heap is unchanged): :func:`start_middle` at the joining
  chunk's end grows the middle chunks' KV and records their trace row and busy time, as
  the fast path's run (or a single step, for one chunk) did; :func:`start_final` at the
  middle part's end allocates the final chunk's KV (the prompt's rest, then one token per
  decode) and records its row, as its single step did. Every iteration is priced at the
  start by the call that priced it before (the single step's
  :func:`~sloserve.engine.executor.price` on its own statistics; the fast path's run
  pricing for two or more middle chunks): the same floats.
* **Cuts**: an arrival routed here (:meth:`Instance.interrupt`) or a client's abort of
  one of its requests before the final chunk began drops what was to follow
  (:func:`drop_final`; nothing of it was allocated or recorded yet): the iterations in
  flight end at their own event as the plain joining step or middle run they were, and
  an interrupt cuts a middle run as before. Once the final chunk began it is a single
  step in flight, which nothing cuts. A failure or the horizon retires what ended, as
  before (:func:`deliver` takes any ``k``).
* **Delivery** (:func:`deliver`), when the run ends: the decodes get ``k`` tokens each,
  as in a run; the prompt's chunks are counted and, at the final iteration, it emits its
  first token at that iteration's end (its first-token time), as the single step did.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sloserve.core.request import Request
from sloserve.costmodel.base import BatchStats, batch_stats
from sloserve.costmodel.linear import LinearCostModel
from sloserve.engine import filling as fills
from sloserve.engine.checks import Split
from sloserve.engine.env import PRIO_ITERATION
from sloserve.engine.executor import CostModelExecutor, price
from sloserve.engine.interface import ScheduledRequest, SchedulerOutput
from sloserve.engine.kv import KVCacheManager, PagedKVManager
from sloserve.engine.prefix_cache import PrefixCachingKVManager

if TYPE_CHECKING:
    from sloserve.engine.fastpath import Run
    from sloserve.engine.instance import Instance, _Pending


JOIN, MIDDLE, FINAL = 0, 1, 2
"""A chain's phase: its joining chunk in flight (a single step), its middle chunks in flight
(a fast run), its final chunk in flight (a single step, never cut)."""


class FinalChunk:
    """The chunks a prompt's run goes on with, to its final one: ``req`` takes ``chunk``
    tokens in each of ``middle`` iterations (a joining chunk, then middle ones) and its
    last ``tokens`` in the final one, the run's decodes (``decode_ids``) one token each;
    the final iteration ends at ``end``. A chain started at the joining chunk (``phase``
    JOIN) has its middle iterations' ends in ``mid_ends`` (none: straight to the final)."""

    __slots__ = ("chunk", "decode_ids", "end", "mid_ends", "middle", "phase", "req", "tokens")

    def __init__(
        self,
        req: Request,
        tokens: int,
        decode_ids: list[int],
        middle: int,
        end: float,
        *,
        chunk: int = 0,
        mid_ends: list[float] | None = None,
        phase: int = MIDDLE,
    ) -> None:
        self.req = req
        self.tokens = tokens
        self.decode_ids = decode_ids
        self.middle = middle
        self.end = end
        self.chunk = chunk
        self.mid_ends = mid_ends
        self.phase = phase


_MANAGERS = (PagedKVManager, PrefixCachingKVManager)
"""The KV managers chunk runs are exact on (module docstring), by exact type."""


def eligible(inst: Instance) -> bool:
    """Whether the instance may run a final chunk inside a fast run at all (module
    docstring: nothing else can join, the paged or prefix-caching manager, the cost model,
    no hand-off)."""
    return (
        inst.scheduler.repeats_final_chunk
        and not inst.waiting
        and not inst.swapped
        and not inst.incoming
        and inst.hand_off is None
        and type(inst.kv) in _MANAGERS
        and inst.executor.__class__ is CostModelExecutor
    )


def _decodes_fit(kv: KVCacheManager, decode_ids: list[int], steps: int, free: int) -> bool:
    """Whether ``decode_ids`` can each grow ``steps`` tokens in ``free`` blocks (the
    paged manager's cheap bound first: every request starting on a full block)."""
    if free >= len(decode_ids) * (steps // kv.block_size + 1):
        return True
    return kv.max_uniform_growth(decode_ids, steps, free) >= steps


def plan(
    inst: Instance,
    out: SchedulerOutput,
    now: float,
    stats: BatchStats,
    work_step: int,
    decode_ids: list[int],
    chunk: tuple[Request, int],
    m: int,
    lead: int,
    cont_left: int,
    left_min: int,
) -> Run | None:
    """The run of ``m`` middle iterations of ``chunk`` and its final chunk, or None (the
    fast path then plans as before). ``stats``, ``work_step``, ``decode_ids``, ``lead``
    and ``left_min`` are :func:`~sloserve.engine.fastpath.plan_run`'s; ``cont_left`` is
    its continuation's fewest tokens left (when ``lead``). The caller checked
    :func:`eligible`, that ``chunk`` is the batch's only non-final chunk and that ``m``
    (its iterations before the final chunk) is the fewest any entry can repeat."""
    from sloserve.engine.fastpath import MAX_FAST_STEPS, Run

    if not inst.multi_step or m + 1 > MAX_FAST_STEPS:
        return None
    r, n = chunk
    n_out = r.num_output_tokens
    rest = r.num_prompt_tokens + n_out - r.num_computed_tokens - m * n  # in 1..n
    if n_out and rest == 1:
        return None  # a one-token refill: a single step prices it as a decode
    if _fewest_left(out.batch, lead, cont_left) <= m:
        return None  # a decode finishes by the final chunk: the batch after it differs
    kv = inst.kv
    reserve = out.repeat_reserve_blocks
    if kv.blocks_needed(r.req_id, m * n + rest) > reserve:
        return None
    if not _decodes_fit(kv, decode_ids, m + 1, kv.num_free_blocks - reserve):
        return None
    t_next = inst.next_event()
    durs, ends = _price_middle(inst, stats, now, m, work_step)
    if ends[-1] >= t_next:
        return None  # an event within the middle part: the run stops there, as before
    end = _final_end(inst, ends[-1], rest, r.num_computed_tokens + m * n, stats, m)
    if end is None or end > t_next:
        return None
    run = Run(m, stats, work_step, decode_ids, [chunk], durs, ends, lead, left_min)
    run.final = FinalChunk(r, rest, decode_ids, m, end, chunk=n)
    return run


def _price_middle(
    inst: Instance, stats: BatchStats, start: float, m: int, work_step: int
) -> tuple[list[float], list[float]]:
    """Durations and ends of ``m`` >= 1 middle iterations from ``start``, as the fast path
    prices a run of them (one alone as the single step it was)."""
    from sloserve.engine.fastpath import accumulate

    cm = inst.cost_model
    if m == 1:
        d = price(cm, stats, inst.scheduler.overlap_swap)
        return [d], [start + d]
    if isinstance(cm, LinearCostModel):
        return cm.run_until(stats, start, math.inf, m, work_step)
    arr = cm.run_times(stats, m, work_step)
    return arr.tolist(), accumulate(start, arr).tolist()


def _final_end(
    inst: Instance, start: float, rest: int, done: int, stats: BatchStats, before: int
) -> float | None:
    """When the final chunk's iteration ends if it starts at ``start``: ``rest`` tokens on
    ``done`` computed ones, with the decodes of ``stats`` ``before`` iterations later,
    priced by the single step's own call on its statistics as ``check_batch`` and
    ``_apply`` count them. None when the step would be refused (no positive time)."""
    nd = stats.num_decode
    ctx = stats.decode_context_sum + before * nd
    final = batch_stats(rest, 1, rest * (rest + done), nd, ctx, 0)
    dur = price(inst.cost_model, final, inst.scheduler.overlap_swap)
    return start + dur if dur > 0 else None


def _fewest_left(batch: Sequence[ScheduledRequest], lead: int, cont_left: int) -> int:
    """The fewest tokens any one-token decode of ``batch`` has still to generate: the
    continuation's figure (``cont_left``) for the ``lead`` entries it checked, the others
    walked (only when a final chunk is in reach: once per chunked prompt)."""
    fewest = cont_left
    for r, n in batch[lead:]:
        n_out = r.num_output_tokens
        if n == 1 and n_out and r.num_prompt_tokens + n_out - r.num_computed_tokens == 1:
            left = r.true_output_len - n_out
            if left < fewest:
                fewest = left
    return fewest


def chain_join(inst: Instance, out: SchedulerOutput, pending: _Pending, split: Split) -> None:
    """A single step that admits a prompt's joining chunk was just recorded (``pending``;
    ``split``: its decodes, their context sum and its other entries): chain the prompt's
    middle and final chunks to it when the policy promises them
    (:attr:`~sloserve.engine.interface.Scheduler.repeats_joined_chunk`) and nothing can
    change them (as :func:`plan`; the counters are still the step's start)."""
    from sloserve.engine.fastpath import MAX_FAST_STEPS

    decode_ids, ctx, others = split
    if len(others) != 1:
        return  # more than one prompt
    r, n = others[0]
    cached = r.num_computed_tokens  # (a prefix found in the cache: its chunks start there)
    prompt = r.num_prompt_tokens - cached  # what it computes
    if not 1 <= n < prompt or r.num_output_tokens:
        return  # its only chunk, or a refill
    batch = out.batch
    if len(batch) != len(inst.running) or out.preempt or not eligible(inst):
        return  # not every running request in it, or something else could join later
    m = (prompt - n - 1) // n  # middle chunks after the joining one
    rest = prompt - n - m * n
    dec = pending.dec  # the checked decodes' fewest tokens left, when they are all
    if dec is not None and len(dec.entries) == len(decode_ids):
        fewest = dec.left
    else:
        fewest = _fewest_left(batch, 0, 1 << 62)
    if not inst.multi_step or m + 2 > MAX_FAST_STEPS or fewest <= m + 1:
        return
    kv = inst.kv
    if not _decodes_fit(
        kv, decode_ids, m + 1, kv.num_free_blocks - kv.blocks_needed(r.req_id, prompt - n)
    ):
        return
    # The middle chunks' batch as the fast path would see it after the join retired.
    nd = len(decode_ids)
    stats = batch_stats(n, 1, n * (n + cached + n), nd, ctx + nd)
    start = pending.ends[0]
    mid_ends: list[float] = []
    if m:
        mid_ends = _price_middle(inst, stats, start, m, n * n)[1]
    end = _final_end(inst, mid_ends[-1] if m else start, rest, cached + n + m * n, stats, m)
    if end is None or end > inst.next_event():
        return
    pending.final = FinalChunk(
        r, rest, decode_ids, 1 + m, end, chunk=n, mid_ends=mid_ends if m else None, phase=JOIN
    )


def advance(inst: Instance, pending: _Pending) -> None:
    """``pending``'s iterations in flight ended now: begin its next phase (the middle
    chunks after the joining one, or the final chunk)."""
    final = pending.final
    assert final is not None
    kv = inst.kv
    if kv.registering:  # prefix caching: the retire before the skipped decision registered
        assert isinstance(kv, PrefixCachingKVManager)
        if inst.debug_checks:
            _check_skipped(inst, kv, pending)
        _register_ended(kv, final.req, final.chunk, len(pending.ends))
    if final.phase == JOIN and final.mid_ends is not None:
        start_middle(inst, pending)
    else:
        start_final(inst, pending)


def _register_ended(kv: PrefixCachingKVManager, req: Request, n: int, k: int) -> None:
    """The first ``k`` iterations of the run ended now, its counters still at their start
    (delivered when the chain ends): register the prompt units they completed, as
    :meth:`PrefixCachingKVManager.retired` did when the retire had delivered them. Only
    the prompt ``req`` (``n`` tokens an iteration) can: the run's other entries are
    running decodes, which left the manager's open requests at the retire that completed
    their prompt (:func:`_check_skipped` checks it)."""
    at = kv._open.get(req.req_id)
    if at is not None:
        done = req.num_computed_tokens + k * n
        if done >= at:  # a unit is complete
            kv._register(req.req_id, done)


def _check_skipped(inst: Instance, kv: PrefixCachingKVManager, pending: _Pending) -> None:
    """What the skipped decision's prefix-cache hooks would have done is nothing (module
    docstring): no lookup queued, no end since the last retry, no CPU copy to price."""
    if kv.arrived or len(inst.done) != kv._ended_seen or kv._transfer or kv._copying:
        raise inst._violation(
            "chunk run", "a skipped decision would have looked up, retried or priced a copy"
        )
    final = pending.final
    assert final is not None
    if any(r is not final.req and r.req_id in kv._open for r, _n in pending.batch):
        raise inst._violation("chunk run", "an entry besides its prompt registers units")


def start_middle(inst: Instance, pending: _Pending) -> None:
    """The joining chunk ended now: begin the middle chunks as the fast path's run (or a
    single step, for one) did at this decision: KV growth, trace row, busy time, event."""
    final = pending.final
    assert final is not None and final.mid_ends is not None
    kv = inst.kv
    now = inst.env.now
    mid_ends = final.mid_ends
    m = len(mid_ends)
    n = final.chunk
    kv_before = kv.num_used_blocks
    if (final.decode_ids and not kv.grow_many(final.decode_ids, m)) or kv.allocate(
        final.req.req_id, m * n
    ) is None:  # chain_join checked this; a failure here is an engine bug
        raise inst._violation("M (KV capacity)", "middle chunks planned to fit do not")
    end = mid_ends[-1]
    _row(inst, now, kv_before, len(pending.batch), n + len(final.decode_ids), m, end)
    pending.busy_before = inst.busy_time
    inst.busy_time += end - now
    pending.row_start = len(pending.ends)
    pending.ends.extend(mid_ends)
    pending.fast = True  # (its middle iterations can be cut, as a run's)
    final.phase = MIDDLE
    final.mid_ends = None
    pending.event = inst.env.schedule(
        end, functools.partial(inst._complete, pending), PRIO_ITERATION
    )


def _row(
    inst: Instance, now: float, kv_used: int, size: int, tokens: int, steps: int, end: float
) -> None:
    """The trace row of a decision taken now (:meth:`Instance._record`'s sample)."""
    tr = inst.trace
    tr.time.append(now)
    tr.running.append(len(inst.running))
    tr.waiting.append(len(inst.waiting))
    tr.swapped.append(len(inst.swapped))
    tr.kv_used_blocks.append(kv_used)
    tr.batch_size.append(size)
    tr.batch_tokens.append(tokens)
    tr.steps.append(steps)
    tr.duration.append(end - now)
    if inst.debug_checks:
        inst.kv.check_invariants()
        fills.check(inst.filling, inst.running)


def start_final(inst: Instance, pending: _Pending) -> None:
    """The middle part of ``pending`` ended now: begin its final iteration as the single
    step did (KV, trace row, busy time, completion event), without asking the policy."""
    final = pending.final
    assert final is not None
    kv = inst.kv
    now = inst.env.now
    kv_before = kv.num_used_blocks
    if kv.allocate(final.req.req_id, final.tokens) is None or (
        final.decode_ids and not kv.grow_many(final.decode_ids, 1)
    ):  # plan checked this; a failure here is an engine bug
        raise inst._violation("M (KV capacity)", "a final chunk planned to fit does not")
    end = final.end
    _row(inst, now, kv_before, len(pending.batch), final.tokens + len(final.decode_ids), 1, end)
    inst.busy_time += end - now
    pending.ends.append(end)
    final.phase = FINAL
    pending.event = inst.env.schedule(
        end, functools.partial(inst._complete, pending), PRIO_ITERATION
    )


def drop_final(pending: _Pending) -> bool:
    """Give up what ``pending`` would go on with, if its final chunk has not started (an
    arrival or an abort reached the replica: the decision at the end of the iterations in
    flight may differ); they then end at their own event, as a plain joining step or
    middle run. False when the final chunk has started (a single step in flight, which
    nothing cuts)."""
    final = pending.final
    if final is None:
        return True
    if final.phase == FINAL:
        return False
    pending.final = None
    return True


def deliver(
    batch: Sequence[ScheduledRequest],
    final: FinalChunk,
    k: int,
    first: int,
    end: float,
    finished: list[Request],
) -> None:
    """Deliver ``k`` iterations of a run with a final chunk to ``batch`` (its entries
    other than the continuation's): decodes one token each per iteration, the chunked
    prompt ``n`` tokens per middle iteration and its rest in the final one (``k`` is
    then ``m + 1``), where it emits its first token at ``end`` as the single step did."""
    req = final.req
    # (Once per chain and a few entries: the continuation delivers the decodes it holds.)
    for r, n in batch:
        if r is req:
            if k <= final.middle:  # (a failure or the horizon: the final one was lost)
                r.num_computed_tokens += k * n
                continue
            r.num_computed_tokens += (k - 1) * n + final.tokens
            if r.first_token_time is None:
                r.first_token_time = end
            r.record_tokens(first + k - 1, 1)  # its first token, in the final iteration
        else:
            r.num_computed_tokens += k
            r.record_tokens(first, k)  # a decode: one token an iteration
        if r.num_output_tokens >= r.true_output_len:
            finished.append(r)
