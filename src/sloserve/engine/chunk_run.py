"""A fast run that ends with a prompt's final chunk.

With chunked prefill (Sarathi's P = 512) a long prompt takes several iterations: the
chunk that joins, middle chunks, and a shorter final chunk that completes the prefill and
emits the first token. The fast path (:mod:`.fastpath`) runs the middle chunks of a
repeatable batch at once, but the run had to stop before the final chunk (a different
batch: a shorter chunk, other statistics), so the final chunk, and a last middle chunk
alone, were each a whole scheduling decision. When the policy promises that its batch at
the final chunk is the same one with the prompt's rest
(:attr:`~sloserve.engine.interface.Scheduler.repeats_final_chunk`), the run goes on
through the final chunk instead: ``m`` middle iterations, then the final one.

Identical to stepping, including the event heap and the trace:

* **When it is taken** (:func:`plan`): the batch holds exactly one non-final chunk,
  every decode has more than ``m`` tokens to go (none finishes before the final
  iteration), nothing waits, is swapped out or waits for KV room (nothing could join at
  the final chunk), the next event that can reach the replica
  (:attr:`Instance.next_event`) is not before the final iteration's end (so nothing
  reads the replica in between, other than an arrival that cuts the run, below), the
  decodes' growth for all ``m + 1`` iterations fits in the free blocks minus the policy's
  reserve, which covers the prompt's rest. Only on the plain paged manager (prefix
  caching registers computed prompt units as iterations retire; BROS's blocks move
  themselves), the cost-model executor, and not on a prefill replica that hands requests
  off. A refill whose final chunk is one token (priced as a decode) steps as before.
* **The middle part is the run the fast path would have made** (``m`` iterations, the
  same trace row, KV growth and completion event; ``m = 1`` priced as a single step). At
  its end (the very event that ended the middle run before, so the event heap keeps the
  same times, priorities and sequence numbers) :func:`start_final` does what the single
  step did: it allocates the final chunk's KV (the prompt's rest, then one token per
  decode), records the decision's trace row and busy time, and schedules the run's end.
  The final iteration is priced at planning time with the single step's own call
  (:func:`~sloserve.engine.executor.price` on the same statistics): the same float.
* **Cuts**: an arrival routed here (:meth:`Instance.interrupt`) or a client's abort of
  one of its requests before the middle part ends drops the final iteration
  (:func:`drop_final`): nothing of it was allocated or recorded yet, and the middle
  run's own completion event ends the run as before; once the final iteration has
  started it is a single step in flight, which nothing cuts. A failure or the horizon
  retires what ended as before (:func:`deliver` takes ``k`` up to ``m + 1``).
* **Delivery** (:func:`deliver`): the decodes get ``k`` tokens each, as in a run; the
  prompt's chunks are counted and, at the final iteration, it emits its first token at
  that iteration's end (its first-token time), exactly as the single step's loop did.
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
from sloserve.engine.env import PRIO_ITERATION
from sloserve.engine.executor import CostModelExecutor, price
from sloserve.engine.interface import ScheduledRequest, SchedulerOutput
from sloserve.engine.kv import PagedKVManager

if TYPE_CHECKING:
    from sloserve.engine.fastpath import Run
    from sloserve.engine.instance import Instance, _Pending


class FinalChunk:
    """The final iteration a fast run of middle chunks goes on with: ``req`` takes its
    last ``tokens`` prompt tokens, the run's decodes (``decode_ids``) one each; it ends at
    ``end``. ``started``: the middle part has ended and this iteration is in flight."""

    __slots__ = ("decode_ids", "end", "middle", "req", "started", "tokens")

    def __init__(
        self, req: Request, tokens: int, decode_ids: list[int], middle: int, end: float
    ) -> None:
        self.req = req
        self.tokens = tokens
        self.decode_ids = decode_ids
        self.middle = middle
        """``m``, the run's middle iterations."""
        self.end = end
        self.started = False


def eligible(inst: Instance) -> bool:
    """Whether the instance may run a final chunk inside a fast run at all (module
    docstring: nothing else can join, the paged manager, the cost model, no hand-off)."""
    return (
        inst.scheduler.repeats_final_chunk
        and not inst.waiting
        and not inst.swapped
        and not inst.incoming
        and inst.hand_off is None
        and type(inst.kv) is PagedKVManager
        and inst.executor.__class__ is CostModelExecutor
    )


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
    from sloserve.engine.fastpath import MAX_FAST_STEPS, Run, accumulate

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
    free = kv.num_free_blocks - reserve
    nd = len(decode_ids)
    if free < nd * ((m + 1) // kv.block_size + 1) and (
        kv.max_uniform_growth(decode_ids, m + 1, free) < m + 1
    ):
        return None
    t_next = inst.next_event()
    cm = inst.cost_model
    overlap = inst.scheduler.overlap_swap
    if m == 1:  # the middle chunk alone was a single step: priced as one
        d = price(cm, stats, overlap)
        durs, ends = [d], [now + d]
    elif isinstance(cm, LinearCostModel):
        durs, ends = cm.run_until(stats, now, math.inf, m, work_step)
    else:
        arr = cm.run_times(stats, m, work_step)
        durs, ends = arr.tolist(), accumulate(now, arr).tolist()
    end_m = ends[-1]
    if end_m >= t_next:
        return None  # an event within the middle part: the run stops there, as before
    # The final chunk's single step: its statistics as check_batch and _apply count them.
    done = r.num_computed_tokens + m * n
    final = batch_stats(rest, 1, rest * (rest + done), nd, stats.decode_context_sum + m * nd, 0)
    dur = price(cm, final, overlap)
    if not dur > 0:
        return None  # the single step raises on it
    end = end_m + dur
    if end > t_next:
        return None
    run = Run(m, stats, work_step, decode_ids, [chunk], durs, ends, lead, left_min)
    run.final = FinalChunk(r, rest, decode_ids, m, end)
    return run


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
    tr = inst.trace
    tr.time.append(now)
    tr.running.append(len(inst.running))
    tr.waiting.append(len(inst.waiting))
    tr.swapped.append(len(inst.swapped))
    tr.kv_used_blocks.append(kv_before)
    tr.batch_size.append(len(pending.batch))
    tr.batch_tokens.append(final.tokens + len(final.decode_ids))
    tr.steps.append(1)
    tr.duration.append(end - now)
    inst.busy_time += end - now
    if inst.debug_checks:
        kv.check_invariants()
        fills.check(inst.filling, inst.running)
    pending.ends.append(end)
    final.started = True
    pending.event = inst.env.schedule(
        end, functools.partial(inst._complete, pending), PRIO_ITERATION
    )


def drop_final(pending: _Pending) -> bool:
    """Give up ``pending``'s final iteration if it has not started (an arrival or an abort
    reached the replica during the middle part: the decision at its end may differ);
    the middle run then ends at its own event. False when it has started (a single step
    in flight, which nothing cuts)."""
    final = pending.final
    if final is None:
        return True
    if final.started:
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
    prev = first - 1
    last = first + k - 1
    req = final.req
    for r, n in batch:
        if r is req:
            if k <= final.middle:  # (a failure or the horizon: the final one was lost)
                r.num_computed_tokens += k * n
                continue
            r.num_computed_tokens += (k - 1) * n + final.tokens
            r.num_output_tokens += 1
            if r.first_token_time is None:
                r.first_token_time = end
            runs = r.token_runs
            if runs and runs[-1] == last - 1:
                runs[-1] = last
            else:
                runs.append(last)
                runs.append(last)
            if r.num_output_tokens >= r.true_output_len:
                finished.append(r)
            continue
        r.num_computed_tokens += k
        r.num_output_tokens += k
        runs = r.token_runs
        if runs and runs[-1] == prev:
            runs[-1] = last
        else:
            runs.append(first)
            runs.append(last)
        if r.num_output_tokens >= r.true_output_len:
            finished.append(r)
