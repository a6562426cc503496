"""GetNextBatch (:mod:`.unified`) for Sarathi's shape, without Algorithm 1's general set-up.

Sarathi (decode priority, hybrid batches, fcfs) asks the general path at every arrival and
at every decision a prompt is filling: its all-decode shortcut does not hold there. That
path builds, per call, a sort key, the group list, a :class:`~.batch_state.State`, two
sets and some twenty locals, then walks the groups, most of which are empty: about
9–12 µs a call, the policy's largest cost in a Sarathi cluster run. :func:`schedule` gives
the same output for the same view by the same steps, specialised to what that shape allows:

* groups (``_groups``, fcfs, decode-first): the running decodes (the running list less the
  filling requests, in running order), the filling requests (arrival order), the swapped
  ones, the waiting ones;
* the decode group is taken whole when C and the free blocks cover one block each, as the
  general path does; the filling and waiting candidates are then tried in order with the
  same budgets (C, P, R_max), the same block needs, promises and watermark, and the same
  exact recount of the decodes' blocks (``settle``) when the bound is short;
* a candidate that fails its budget or R_max ends its group (GotoNextGroup), a waiting one
  that finds M short without leave to evict ends its group too, and a filling one that
  finds M short without leave to evict keeps its promised blocks: as the general loop.

Whenever the general path would do something else — a decode group not taken whole, a
swapped request, an eviction that may happen — :func:`schedule` returns None *before*
anything is changed, and the caller runs the general path (the only state either touches
is the decode-entry cache, which both fill alike). Used only where
:class:`~.unified.UnifiedScheduler` itself schedules (not a subclass, whose ``_groups`` or
``_key`` may differ), with groups ``decode-first``, ``fcfs``, hybrid batches and no
eviction-free reservation; ``tests/test_decode_first.py`` compares its output with the
general path's at every decision of random runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sloserve.core.request import Request
from sloserve.engine.interface import (
    InstanceView,
    ScheduledRequest,
    SchedulerOutput,
    scheduler_output,
)

if TYPE_CHECKING:
    from sloserve.policies.infermax.unified import UnifiedScheduler

_new_entry = tuple.__new__


def schedule(
    sched: UnifiedScheduler, view: InstanceView, fillers: list[Request]
) -> SchedulerOutput | None:
    """The general path's output for ``view`` (``fillers``: the running requests part-way
    through a (re)fill, in arrival order), or None when that path may do something this
    one does not (module docstring)."""
    if view.swapped:
        return None
    cfg = sched.config
    lim = view.limits
    kv = view.kv
    running = view.running
    blocks_needed = kv.blocks_needed
    free = kv.num_free_blocks
    promised: dict[int, int] = {}
    decodes: Sequence[Request] = running
    if fillers:
        for r in fillers:
            rid = r.req_id
            need = blocks_needed(
                rid, r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens
            )
            promised[rid] = need
            free -= need
        rest = list(running)
        for r in fillers:  # (usually one: removing it, in C, beats a second pass)
            rest.remove(r)
        decodes = rest
    budget_c = lim.max_batch_tokens
    budget_p = lim.max_prefill_tokens
    n_dec = len(decodes)
    batch: list[ScheduledRequest] = []
    unsettled = False
    if n_dec:
        if budget_c < n_dec or free < n_dec:
            return None  # candidate by candidate, maybe evicting: the general path
        # One block charged per decode, counted exactly only when a candidate finds the
        # bound short (settle), as the general path does.
        free -= n_dec
        unsettled = True
        budget_c -= n_dec
        batch.extend(sched._decode_batch(decodes))
    chunked = cfg.chunked_prefill
    may_evict = cfg.evict  # (eviction-free variants never come here)
    steady = reserve = 0
    entries = sched._decode_entries
    for cand in fillers:  # running, not a one-token decode (_filling's test)
        rid = cand.req_id
        remaining = cand.num_prompt_tokens + cand.num_output_tokens - cand.num_computed_tokens
        room = budget_c if budget_c < budget_p else budget_p
        n = min(remaining, room) if chunked else remaining
        if not 1 <= n <= room:
            break
        need = promised.pop(rid, 0) or blocks_needed(rid, remaining)
        free += need  # it was counted as promised
        # (No recount of the decodes' blocks here, unlike the general loop's test: when
        # they were taken whole, free covered every promise, this one included, so a
        # filling request never finds the bound short; only with no decodes can it be.)
        if need > free:
            if may_evict:
                return None
            free -= need  # still promised to it
            break
        free -= need
        budget_c -= n
        budget_p -= n
        batch.append(_new_entry(ScheduledRequest, (cand, n)))
        if n == remaining:
            entries[cand] = _new_entry(ScheduledRequest, (cand, 1))  # (it decodes next)
        elif n < remaining:
            steady += 1
            reserve += need
    waiting = view.waiting
    if waiting:
        n_running = len(running)
        max_running = lim.max_running
        watermark = int(cfg.watermark * kv.num_blocks)
        evict_waiting = may_evict and cfg.evict_for_waiting
        for cand in waiting:
            rid = cand.req_id
            n_out = cand.num_output_tokens
            remaining = cand.num_prompt_tokens + n_out - cand.num_computed_tokens
            is_decode = n_out > 0 and remaining == 1
            if is_decode:
                n = 1
                ok = budget_c >= 1
            else:
                room = budget_c if budget_c < budget_p else budget_p
                n = min(remaining, room) if chunked else remaining
                ok = 1 <= n <= room
            if not ok or n_running >= max_running:
                break
            if is_decode:
                need = blocks_needed(rid, 1)
            else:
                need = promised.pop(rid, 0) or blocks_needed(rid, remaining)
            if unsettled and need + watermark > free:
                free += n_dec - kv.decode_blocks_needed([r.req_id for r in decodes])
                unsettled = False
            if need + watermark > free:
                if evict_waiting:
                    return None
                break
            free -= need
            budget_c -= n
            if not is_decode:
                budget_p -= n
            n_running += 1
            batch.append(_new_entry(ScheduledRequest, (cand, n)))
            if n == remaining and not is_decode:
                entries[cand] = _new_entry(ScheduledRequest, (cand, 1))
    repeatable = bool(batch) and n_dec + steady == len(batch) == len(running)
    return scheduler_output(tuple(batch), (), (), repeatable, reserve)
