"""Retiring an iteration (or the first iterations of a fast-forwarded run): its tokens and
finishes delivered to the requests when it ends.

DESIGN.md's timing: a batch's tokens are delivered when its iteration ends. :func:`retire`
records the iterations' end times (:attr:`Instance.iter_end`: token times index into it),
advances each entry's counters (a prefill chunk's computed tokens; a decode's or a final
chunk's token, as a run of token indices), and finishes the requests that emitted their
last token: KV freed, ``finish``, :meth:`Scheduler.on_finish` and the instance's ``on_done``
callbacks, all at the end of the iteration that emitted it. Three shapes of pending batch:

* the checked running decodes leading the batch (:mod:`.continuation`) are delivered as
  such and become the next decision's continuation;
* a prompt's chunks carried to its final one (:mod:`.chunk_run`) deliver through it;
* the rest: a fast run (every iteration the same entries, ``k`` of them delivered at
  once) or a single step.

Called when a pending batch completes (:meth:`Instance._complete`), and by teardown for
the iterations of a run that ended before an abort of everything or a failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sloserve.core.request import Request
from sloserve.engine import chunk_run, teardown
from sloserve.engine import continuation as conts
from sloserve.engine import filling as fills
from sloserve.engine.executor import CostModelExecutor, eos_finished
from sloserve.engine.interface import ScheduledRequest

if TYPE_CHECKING:
    from sloserve.engine.instance import Instance, _Pending


def retire(inst: Instance, pending: _Pending, k: int) -> None:
    """Deliver the first ``k`` iterations of ``pending``: tokens, finishes."""
    ends = pending.ends
    if k != len(ends):
        ends = ends[:k]
    end = ends[-1]
    first = len(inst.iter_end)
    inst.iter_end.extend(ends)
    finished: list[Request] = []
    prev = first - 1  # a run of tokens ending here is extended, not restarted
    batch: Sequence[ScheduledRequest] = pending.batch
    dec = pending.dec
    if dec is not None:  # checked running decodes first: they become the continuation
        conts.deliver(inst, dec, k, first, finished)
        n_dec = len(dec.entries)
        batch = batch[n_dec:] if n_dec != len(batch) else ()
    if not batch:
        pass
    elif pending.final is not None:
        chunk_run.deliver(batch, pending.final, k, first, end, finished)
    elif pending.fast:
        last = first + k - 1
        for r, n in batch:
            if r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens != 1:
                r.num_computed_tokens += k * n  # a non-final prefill chunk: no token
                continue
            r.num_computed_tokens += k
            r.num_output_tokens += k
            runs = r.token_runs  # inlined Request.record_tokens: this is the hot loop
            if runs and runs[-1] == prev:
                runs[-1] = last
            else:
                runs.append(first)
                runs.append(last)
            if r.num_output_tokens >= r.true_output_len:
                finished.append(r)
    else:
        for r, n in batch:
            r.num_computed_tokens += n
            if r.num_computed_tokens == r.num_prompt_tokens + r.num_output_tokens:
                if r.first_token_time is None:
                    r.first_token_time = end
                r.num_output_tokens += 1
                runs = r.token_runs  # inlined Request.record_tokens (hot loop)
                if runs and runs[-1] == prev:
                    runs[-1] = first
                else:
                    runs.append(first)
                    runs.append(first)
                if r.num_output_tokens >= r.true_output_len:
                    finished.append(r)
    kv = inst.kv
    if kv.registering:  # prefix caching: cache the prompt units computed now
        kv.retired(pending.batch)
    if inst.executor.__class__ is not CostModelExecutor:  # (it never stops a request)
        finished += eos_finished(inst.executor, pending.batch)  # execute mode's EOS
        inst._cont = None  # (an early stop is not among the continuation's finishes)
    for r in finished:
        kv.free(r.req_id)
        inst.running.remove(r)
        r.finish(end)
        inst.scheduler.on_finish(r, end)
        inst._done(r)
    if inst.hand_off is not None:
        inst._cont = None  # requests leave after their first token
        teardown.hand_off(inst, pending.batch, end)
    if inst.filling:
        fills.prune(inst.filling, inst.instance_id)
