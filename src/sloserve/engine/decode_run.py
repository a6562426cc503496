"""A run of decodes carried through a finish: the policy's promised answer, not asked.

A fast run of decodes (:mod:`.fastpath`) stops at the iteration in which the first of
them emits its last token. That request finishes at its own instant, as ever: the
instance retires it there (KV freed, ``finish``, ``Scheduler.on_finish``, the ``on_done``
callbacks, so a cluster and its routers see it then). The next decision used to ask the
policy again, which, with nothing waiting, scheduled the very same decodes minus the
finished: more than a third of the decisions of a vLLM run. When the policy promises that
answer (:attr:`~sloserve.engine.interface.Scheduler.repeats_decode_run`) and the
instance meets the promise's conditions, :func:`repeat` gives it without the call: the
continuation's entries (:mod:`.continuation`: the running decodes, in the previous
batch's order, the finished already cut out), repeatable, no reserve, no eviction, no
swap-in. The instance then applies it as it would the policy's equal output; the fast
path plans the next run from the continuation (its context sum and fewest tokens left)
without walking the entries.

Identical to asking the policy, so nothing else moves: the decision still happens at the
same instant (right after the retirement, in the same event), records its trace row,
grows its KV, schedules its completion event; arrivals, aborts, the horizon, failures and
mid-run reads see what they saw. The conditions (all cheap, read as the policy would):

* the continuation covers every running request (the same count: its entries are
  distinct running requests, :func:`~sloserve.engine.continuation.verify`), so every
  running request is a one-token decode already checked;
* nothing waits, is swapped out or is still to be admitted (``incoming``);
* each decode fits whatever block it needs (``len(running) <= num_free_blocks``) and the
  batch fits C (``len(running) <= max_batch_tokens``).

A single step whose batch is running one-token decodes only (the next event a single
iteration away, or a decode with one token left) makes its whole batch the continuation
too (:func:`whole`; before, only a fast run did, and a single step kept the part the
continuation already held), so the decision after it can be promised as well.

Under the engine's invariant checks the policy is asked anyway and its answer compared
(a broken promise raises :class:`~sloserve.core.errors.SchedulerViolation`), so tests
with ``check_invariants`` verify the promise on every decision it skips.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sloserve.engine.checks import Split
from sloserve.engine.continuation import Continuation
from sloserve.engine.interface import ScheduledRequest, SchedulerOutput, scheduler_output

if TYPE_CHECKING:
    from sloserve.engine.instance import Instance


def repeat(inst: Instance, cont: Continuation) -> SchedulerOutput | None:
    """The batch the policy promised for this decision (module docstring), or None when
    the instance does not meet the promise's conditions (then the policy is asked)."""
    n = len(cont.entries)
    if (
        n != len(inst.running)
        or inst.waiting
        or inst.swapped
        or inst.incoming
        or n > inst.kv.num_free_blocks
        or n > inst.limits.max_batch_tokens
    ):
        return None
    out = scheduler_output(cont.entries, (), (), True, 0)
    if inst.debug_checks:
        _check(inst, out)
    return out


def _check(inst: Instance, out: SchedulerOutput) -> None:
    """Ask the policy anyway and compare (invariant checks only): the same entries in the
    same order, repeatable, nothing reserved, evicted or swapped in."""
    asked = inst.scheduler.schedule(inst.view)
    if (
        tuple(asked.batch) != out.batch
        or asked.preempt
        or asked.swap_in
        or not asked.repeatable
        or asked.repeat_reserve_blocks
    ):
        raise inst._violation(
            "repeats_decode_run",
            f"promised the running decodes {[r.req_id for r, _n in out.batch]} again, "
            f"scheduled {[(r.req_id, n) for r, n in asked.batch]} "
            f"(repeatable={asked.repeatable}, {len(asked.preempt)} evicted, "
            f"{len(asked.swap_in)} swapped in, reserve {asked.repeat_reserve_blocks})",
        )


_NONE_LEFT = 1 << 62


def whole(
    batch: Sequence[ScheduledRequest], split: Split, lead: Continuation | None
) -> Continuation | None:
    """A single step's batch as the continuation it becomes once delivered, when
    :func:`~sloserve.engine.checks.check_batch` found only running one-token decodes in it
    (``split``: their ids and context sum, no other entry; none evicted, the caller checked)
    and ``lead`` (the continuation its first entries are, if any) or None. Its entries
    were checked there (running here, one token each, none twice); only the fewest tokens
    left is counted, for the entries after ``lead``'s."""
    decode_ids, ctx, others = split
    if others or not decode_ids:
        return lead
    entries = batch if batch.__class__ is tuple else tuple(batch)
    n_lead = 0
    left = _NONE_LEFT
    if lead is not None:
        n_lead = len(lead.entries)
        left = lead.left
    for r, _n in entries[n_lead:]:
        rest = r.true_output_len - r.num_output_tokens
        if rest < left:
            left = rest
    return Continuation(entries, decode_ids, ctx, left)
